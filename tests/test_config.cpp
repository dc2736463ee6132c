// tests/test_config.cpp: the strict YAML config: defaults, values, every kind of mistake reported
// at once with file:line:col and the dotted key, "did you mean", --set overrides, and a dump that
// reads back to the same configuration.
#include "core/error.h"
#include "test_helpers.h"
#include "train/config.h"

#include <fstream>
#include <set>
#include <sstream>

using namespace fg;

namespace {

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    try {
        parse_config(yaml, "x.yaml", overrides);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("an empty config is all defaults, and values override them", "[config]") {
    Config d = parse_config("", "empty.yaml");
    REQUIRE(d.model.n_layer == Config{}.model.n_layer);
    Config c = parse_config(
        "model:\n  n_layer: 6\n  n_head: 6\n  n_embd: 384\n  norm: rmsnorm\n  gelu: tanh\n  bias: false\n"
        "  dropout: 0.2\noptim:\n  lr: 1e-3\n  beta2: 0.99\ntrain:\n  device: cpu\n",
        "c.yaml");
    REQUIRE(c.model.n_layer == 6);
    REQUIRE(c.model.n_embd == 384);
    REQUIRE(c.model.norm == NormLayer::rmsnorm);
    REQUIRE(c.model.gelu == GeluForm::tanh);
    REQUIRE(d.model.gelu == GeluForm::exact);
    REQUIRE_FALSE(c.model.bias);
    REQUIRE(c.model.dropout == 0.2);
    REQUIRE(c.optim.lr == 1e-3);
    REQUIRE(c.train.device == DeviceChoice::cpu);
}

TEST_CASE("config mistakes are all reported, with position and key", "[config][errors]") {
    std::string yaml =
        "model:\n"            // 1
        "  n_layerz: 4\n"     // 2: unknown key, near miss
        "  n_head: four\n"    // 3: wrong type
        "  n_embd: 2.5\n"     // 4: not an integer
        "  n_head: 2\n"       // 5: duplicate
        "optim:\n"            // 6
        "  lr: 0\n"           // 7: out of range
        "trian:\n"            // 8: unknown section, near miss
        "  steps: 10\n";
    std::string e = error_of(yaml);
    REQUIRE_THAT(e, ContainsSubstring("x.yaml:2:3: model.n_layerz: unknown key (did you mean 'n_layer'?)"));
    REQUIRE_THAT(e, ContainsSubstring("x.yaml:3:11: model.n_head: expected an integer, got 'four'"));
    REQUIRE_THAT(e, ContainsSubstring("x.yaml:4:11: model.n_embd: expected an integer, got '2.5'"));
    REQUIRE_THAT(e, ContainsSubstring("x.yaml:5:3: model.n_head: duplicate key"));
    REQUIRE_THAT(e, ContainsSubstring("x.yaml:7:7: optim.lr: must be > 0, got 0"));
    REQUIRE_THAT(e, ContainsSubstring("x.yaml:8:1: trian: unknown section (did you mean 'train'?)"));
}

TEST_CASE("cross-key and range checks", "[config][errors]") {
    REQUIRE_THAT(error_of("model:\n  n_embd: 100\n  n_head: 3\n"),
                 ContainsSubstring("model.n_embd: n_embd (100) must be a multiple of model.n_head (3)"));
    REQUIRE_THAT(error_of("train:\n  batch_size: 0\n"),
                 ContainsSubstring("x.yaml:2:15: train.batch_size: must be >= 1, got 0"));
    REQUIRE_THAT(error_of("model:\n  norm: batchnorm\n"),
                 ContainsSubstring("model.norm: must be one of layernorm, rmsnorm, got \"batchnorm\""));
    REQUIRE_THAT(error_of("model:\n  gelu: erf\n"),
                 ContainsSubstring("model.gelu: must be one of exact, tanh, got \"erf\""));
    REQUIRE_THAT(error_of("data:\n  kind: text\n"), ContainsSubstring("data.path: data.kind is text"));
    REQUIRE_THAT(error_of("train:\n  out_dir: \"\"\n"),
                 ContainsSubstring("train.out_dir: must name a directory"));
    REQUIRE_THAT(error_of("train:\n  batch_size: 1000000000000000000\n"),
                 ContainsSubstring("train.batch_size: train.batch_size x (model.block_size + 1) =") &&
                     ContainsSubstring("tokens a micro-batch, more than 2^50"));
    REQUIRE_THAT(error_of("model:\n  dropout: 1.0\n"), ContainsSubstring("model.dropout: must be in [0, 1)"));
    REQUIRE_THAT(error_of("model: [1, 2]\n"), ContainsSubstring("model: expected a map of keys"));
    REQUIRE_THAT(error_of("model:\n  n_layer: [1]\n"), ContainsSubstring("model.n_layer: expected an integer, got a list"));
    REQUIRE_THAT(error_of("model:\n  n_layer: 4\n n_head: 2\n"),  // bad YAML: the parser's message
                 ContainsSubstring("x.yaml:3:") && ContainsSubstring("(yaml): end of map not found"));
    REQUIRE_THROWS_WITH(load_config("/nonexistent/c.yaml"), ContainsSubstring("[config] cannot read"));
}

TEST_CASE("config overrides (--set) are checked like the file", "[config]") {
    Config c = parse_config("model:\n  n_layer: 2\n", "x.yaml", {"model.n_layer=5", "optim.lr=3e-4"});
    REQUIRE(c.model.n_layer == 5);
    REQUIRE(c.optim.lr == 3e-4);
    REQUIRE_THAT(error_of("", {"model.n_layr=5"}),
                 ContainsSubstring("--set model.n_layr=5: model.n_layr: unknown key (did you mean 'n_layer'?)"));
    REQUIRE_THAT(error_of("", {"train.steps=-1"}), ContainsSubstring("train.steps: must be >= 1, got -1"));
    REQUIRE_THAT(error_of("", {"nonsense"}), ContainsSubstring("expected key.path=value"));
}

TEST_CASE("the dump reads back to the same config, with comments", "[config]") {
    Config c = parse_config("model:\n  n_layer: 3\n  norm: rmsnorm\ndata:\n  path: a b.txt\n", "x.yaml");
    std::string text = dump_config(c);
    REQUIRE_THAT(text, ContainsSubstring("n_layer: 3") && ContainsSubstring("# transformer blocks"));
    Config again = parse_config(text, "dump");
    REQUIRE(dump_config(again) == text);
    REQUIRE(again.data.path == "a b.txt");
}

TEST_CASE("config structure errors", "[config][errors]") {
    REQUIRE_THAT(error_of("- a\n- b\n"), ContainsSubstring("x.yaml:1:1: (top): expected a map of sections"));
    REQUIRE_THAT(error_of("model:\n  n_layer: 2\nmodel:\n  n_head: 2\n"),
                 ContainsSubstring("x.yaml:3:1: model: duplicate section"));
    REQUIRE_THAT(error_of("", {"modle.n_layer=2"}),
                 ContainsSubstring("--set modle.n_layer=2: modle: unknown section (did you mean 'model'?)"));
    REQUIRE_THAT(error_of("", {"model.n_layer=[1"}),
                 ContainsSubstring("--set model.n_layer=[1: model.n_layer: end of sequence flow not found"));
    REQUIRE_THAT(error_of("optim:\n  lr: 1.0e-4\n  min_lr: 1.0e-3\n"),
                 ContainsSubstring("optim.min_lr: min_lr must not exceed optim.lr"));
}

TEST_CASE("the shipped configs load and hold only what differs from the defaults, commented",
          "[config]") {
    for (const char* name : {"addition.yaml", "shakespeare_char.yaml", "gpt2_124m.yaml"}) {
        const std::string path = std::string(FG_SOURCE_DIR) + "/configs/" + name;
        INFO(path);
        Config c = load_config(path);
        std::set<std::string> differing;  // "section.key"
        for (const std::string& change : changed_keys(Config{}, c))
            differing.insert(change.substr(0, change.find(' ')));
        std::ifstream in(path);
        std::string section;
        for (std::string line; std::getline(in, line);) {
            if (line.empty() || line[0] == '#') continue;
            if (line[0] != ' ') {
                section = line.substr(0, line.find(':'));
                continue;
            }
            if (line.find_first_not_of(' ') == line.find('#')) continue;  // a comment line
            const std::size_t start = line.find_first_not_of(' ');
            const std::string key = section + "." + line.substr(start, line.find(':') - start);
            INFO(line);
            CHECK(differing.count(key) == 1);         // a default repeated is noise
            CHECK(line.find(" # ") != std::string::npos);  // and every line says why
        }
    }
    // The baby GPT is nanoGPT's shakespeare_char shape and schedule.
    Config s = load_config(std::string(FG_SOURCE_DIR) + "/configs/shakespeare_char.yaml");
    CHECK(s.model.n_layer == 6);
    CHECK(s.model.n_head == 6);
    CHECK(s.model.n_embd == 384);
    CHECK(s.model.block_size == 256);
    CHECK(s.model.dropout == 0.2);
    CHECK_FALSE(s.model.bias);
    CHECK(s.train.batch_size == 64);
    CHECK(s.train.steps == 5000);
    CHECK(s.optim.lr == 1e-3);
    CHECK(s.optim.min_lr == 1e-4);
    CHECK(s.optim.warmup_steps == 100);
    CHECK(s.optim.beta2 == 0.99);
    CHECK(s.optim.weight_decay == 0.1);
    CHECK(s.optim.grad_clip == 1.0);
    CHECK(s.data.kind == DataKind::text);
}

TEST_CASE("the saved config reads back exactly, whatever the values", "[config]") {
    Config c;
    c.optim.lr = 0.00123456789;
    c.optim.beta2 = 0.9999999;
    c.optim.min_lr = 1e-300;
    c.optim.weight_decay = 1.0 / 3.0;
    c.data.val_fraction = 0.1 + 0.2;  // 0.30000000000000004
    c.model.dropout = 5e-324;         // the smallest subnormal
    c.train.precision = Precision::bf16;
    Config back = parse_config(dump_config(c), "dump.yaml");
    CHECK(back.optim.lr == c.optim.lr);
    CHECK(back.optim.beta2 == c.optim.beta2);
    CHECK(back.optim.min_lr == c.optim.min_lr);
    CHECK(back.optim.weight_decay == c.optim.weight_decay);
    CHECK(back.data.val_fraction == c.data.val_fraction);
    CHECK(back.model.dropout == c.model.dropout);
    CHECK(back.train.precision == Precision::bf16);
    CHECK(dump_config(back) == dump_config(c));
    // A decimal point in every float's mantissa: YAML 1.1 readers (PyYAML, bench/train_torch.py)
    // read "1e-300" as a string.
    const std::string text = dump_config(c);
    CHECK(text.find("min_lr: 1.0e-300 ") != std::string::npos);
    CHECK(text.find("dropout: 5.0e-324 ") != std::string::npos);
    CHECK(text.find("grad_clip: 1.0 ") != std::string::npos);
    for (const std::string& s :
         {std::string(""), std::string("runs/it's \"quoted\": #not a comment"),
          std::string("C:\\tmp\\t.txt"), std::string("tab\there, newline\nthere"),
          std::string("null"), std::string("~"), std::string("true"), std::string("123"),
          std::string("1e3"), std::string(" leading and trailing "), std::string("- dash"),
          std::string("[list]"), std::string("{map: 1}"), std::string("*alias"),
          std::string("&anchor"), std::string("!tag"), std::string("%directive"),
          std::string("@at"), std::string("`tick"), std::string("caf\xc3\xa9 \xe2\x9c\x93"),
          std::string("a: b # c"), std::string("'single'"), std::string("---")}) {
        INFO("string [" << s << "]");
        c.train.out_dir = s.empty() ? std::string("runs/x") : s;  // "" is refused (a test above)
        c.data.path = s;
        Config r = parse_config(dump_config(c), "dump.yaml");
        CHECK(r.train.out_dir == c.train.out_dir);
        CHECK(r.data.path == s);
    }
}

TEST_CASE("an empty config file, a directory, and non-finite numbers are errors", "[config][errors]") {
    const std::string empty = "/tmp/fg_empty_config.yaml", blank = "/tmp/fg_blank_config.yaml";
    { std::ofstream(empty).flush(); }
    { std::ofstream(blank) << "  \n# only a comment\n\n"; }
    REQUIRE_THROWS_WITH(load_config(empty), ContainsSubstring("[config] '" + empty + "' is empty"));
    REQUIRE_THROWS_WITH(load_config(blank), ContainsSubstring("[config] '" + blank + "' is empty"));
    REQUIRE_THROWS_WITH(load_config("/tmp"), ContainsSubstring("[config] '/tmp' is a directory, not a config file"));
    REQUIRE_THROWS_WITH(parse_config("optim: {lr: .inf}", "x.yaml"),
                        ContainsSubstring("optim.lr: must be a finite number, got '.inf'"));
    REQUIRE_THROWS_WITH(parse_config("", "x.yaml", {"optim.beta1=.nan"}),
                        ContainsSubstring("optim.beta1: must be a finite number, got '.nan'"));
}
