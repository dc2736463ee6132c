// tests/test_run_dir.cpp: a run directory survives bad commands and damaged files. A refused
// resume changes nothing; a checkpoint is verified (sizes, checksums, one step, every tensor)
// before it is loaded; leftovers of an interrupted save block nothing; a non-finite loss stops the
// run before it spoils the weights; a new run takes only a directory that is empty or a failed
// start's, a checkpoint removes only the folder it replaces, and no write follows a planted link;
// sample and eval read a run back; a failed best save says whether a checkpoint stays; a run too
// large for memory is refused first. The kill -9 and full-disk tests are
// tests/fault_injection.sh.
#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <tuple>

#include "core/allocator.h"
#include "core/error.h"
#include "test_helpers.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace fg;
namespace fs = std::filesystem;

namespace {

Config tiny(const std::string& dir, std::int64_t steps) {
    return test::tiny_addition_run(dir, steps);
}

std::string run_once(const std::string& dir, std::int64_t steps) {
    fs::remove_all(dir);
    std::ostringstream log;
    Trainer t(tiny(dir, steps), log);
    t.run();
    return dir;
}

std::string checkpoint_file(const std::string& dir, const std::string& name) {
    return (fs::path(dir) / verified_checkpoint(dir).folder / name).string();
}

// Loads dir's checkpoint, lets `edit` change it, and commits the result as `step` (so every
// checksum is right: what is wrong is only what edit did).
using CheckpointEdit = std::function<void(SafetensorsFile& model, SafetensorsFile& state)>;
void commit_edited(const std::string& dir, std::int64_t step, const CheckpointEdit& edit) {
    SafetensorsFile model = load_safetensors(checkpoint_file(dir, "model.safetensors"));
    SafetensorsFile state = load_safetensors(checkpoint_file(dir, "train_state.safetensors"));
    edit(model, state);
    fs::create_directories(partial_folder(dir));
    save_safetensors(partial_folder(dir) + "/model.safetensors", model.tensors, model.metadata);
    save_safetensors(partial_folder(dir) + "/train_state.safetensors", state.tensors,
                     state.metadata);
    commit_checkpoint(dir, step);
}

// The tensors of `file` without the one named `name`.
void drop(SafetensorsFile& file, const std::string& name) {
    std::vector<std::pair<std::string, Tensor>> kept;
    for (auto& [n, t] : file.tensors)
        if (n != name) kept.emplace_back(n, t);
    file.tensors = kept;
}

}  // namespace

TEST_CASE("a refused resume leaves the run directory exactly as it was", "[run_dir]") {
    const std::string dir = run_once("/tmp/fg_rd_refused", 4);
    const auto before = test::files_under(dir);
    std::ostringstream log;
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {"model.n_embd=64"}, log),
                        ContainsSubstring("[resume] model.n_embd cannot change when resuming"));
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {"optim.name=sgd"}, log),
                        ContainsSubstring("[resume] optim.name cannot change"));
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {"train.seed=3"}, log),
                        ContainsSubstring("[resume] train.seed cannot change") &&
                            ContainsSubstring("a resumed run may change optim.lr, optim.min_lr"));
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {"model.n_layerz=2"}, log),
                        ContainsSubstring("model.n_layerz: unknown key"));
    CHECK(test::files_under(dir) == before);
    // Allowed: a longer schedule. The resumed config is then the run's.
    auto t = Trainer::resume(dir, {"train.steps=6"}, log);
    t->run();
    CHECK(t->step() == 6);
    CHECK(load_config(dir + "/config.yaml").train.steps == 6);
}

TEST_CASE("a damaged checkpoint is refused, naming the file and what is wrong", "[run_dir]") {
    std::ostringstream log;
    const std::string dir = "/tmp/fg_rd_damaged";
    auto fresh = [&]() { return run_once(dir, 4); };
    // A flipped byte in the weights.
    fresh();
    {
        std::fstream f(checkpoint_file(dir, "model.safetensors"),
                       std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(200);
        f.put('\x5a');
    }
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("model.safetensors' does not match its checksum") &&
                            ContainsSubstring("the file is corrupt"));
    // A truncated optimizer state.
    fresh();
    fs::resize_file(checkpoint_file(dir, "train_state.safetensors"), 100);
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("train_state.safetensors' has 100 bytes") &&
                            ContainsSubstring("(truncated or replaced)"));
    // A missing file.
    fresh();
    fs::remove(checkpoint_file(dir, "train_state.safetensors"));
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("train_state.safetensors', part of the checkpoint of step 4, is "
                                 "missing"));
    // A damaged manifest.
    fresh();
    { std::ofstream(dir + "/checkpoint.json") << "{\"step\": 4"; }
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("checkpoint.json' is corrupt"));
    std::ofstream(dir + "/checkpoint.json") << R"({"step": -1, "folder": "x", "files": {}})";
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log), ContainsSubstring("names step -1"));
    std::ofstream(dir + "/checkpoint.json") << R"({"step": 1, "folder": "../etc", "files": {}})";
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log), ContainsSubstring("not one in checkpoints/"));
    // File names that would lead out of the checkpoint folder are not even looked at.
    for (const char* name : {"/etc/hostname", "../../../etc/hostname", "..", "a/b"}) {
        std::ofstream(dir + "/checkpoint.json")
            << R"({"step": 4, "folder": "checkpoints/step_00000004", "files": {")" << name
            << R"(": {"bytes": 1, "xxh3": "0"}}})";
        REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                            ContainsSubstring(std::string("lists the file '") + name +
                                     "', which is not a name inside its checkpoint folder"));
    }
    // No manifest at all.
    fresh();
    fs::remove(dir + "/checkpoint.json");
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("holds no checkpoint (checkpoint.json is missing)"));
}

TEST_CASE("files of two steps, or an incomplete optimizer state, are not one checkpoint",
          "[run_dir]") {
    std::ostringstream log;
    // Weights of step 2 with the optimizer state of step 4, committed together (so every
    // checksum is right): the steps inside the files still tell.
    const std::string a = run_once("/tmp/fg_rd_step2", 2), b = run_once("/tmp/fg_rd_step4", 4);
    const std::string partial = partial_folder(b);
    fs::create_directories(partial);
    fs::copy_file(checkpoint_file(a, "model.safetensors"), partial + "/model.safetensors");
    fs::copy_file(checkpoint_file(b, "train_state.safetensors"),
                  partial + "/train_state.safetensors");
    commit_checkpoint(b, 4);
    REQUIRE_THROWS_WITH(Trainer::resume(b, {}, log),
                        ContainsSubstring("model.safetensors' is from step 2") &&
                            ContainsSubstring("they are not one checkpoint"));
    // An optimizer state without one of AdamW's moments.
    const std::string c = run_once("/tmp/fg_rd_moments", 2);
    commit_edited(c, 2, [](SafetensorsFile&, SafetensorsFile& state) {
        drop(state, "transformer.wte.weight.exp_avg_sq");
    });
    REQUIRE_THROWS_WITH(Trainer::resume(c, {}, log),
                        ContainsSubstring("has no 'transformer.wte.weight.exp_avg_sq'") &&
                            ContainsSubstring("the optimizer state is incomplete"));
}

TEST_CASE("a checkpoint whose parts do not fit the run is refused by name", "[run_dir]") {
    std::ostringstream log;
    const std::string dir = "/tmp/fg_rd_parts";
    const std::vector<std::tuple<std::int64_t, CheckpointEdit, std::string>> cases{
        {4, [](SafetensorsFile&, SafetensorsFile&) {},
         "train_state.safetensors' is from step 2, the manifest says 4"},
        {2, [](SafetensorsFile& m, SafetensorsFile&) { drop(m, "transformer.ln_f.weight"); },
         "model.safetensors' has no tensor 'transformer.ln_f.weight'"},
        {2,
         [](SafetensorsFile& m, SafetensorsFile&) {
             for (auto& [n, t] : m.tensors)
                 if (n == "transformer.ln_f.weight") t = t.to(DType::bf16);
         },
         "'transformer.ln_f.weight' is bf16, the master weights are f32"},
        {2,
         [](SafetensorsFile&, SafetensorsFile& st) {
             for (auto& [n, t] : st.tensors)
                 if (n == "transformer.ln_f.weight.exp_avg") t = t.to(DType::f64);
         },
         "'transformer.ln_f.weight.exp_avg' is f64, not f32"},
        {2, [](SafetensorsFile&, SafetensorsFile& st) { st.metadata["optimizer"] = "sgd"; },
         "was written by another optimizer than optim.name = adamw"},
    };
    for (const auto& [step, edit, expected] : cases) {
        INFO(expected);
        run_once(dir, 2);
        commit_edited(dir, step, edit);
        REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log), ContainsSubstring(expected));
    }
    // A manifest that lists only the weights.
    run_once(dir, 2);
    fs::create_directories(partial_folder(dir));
    fs::copy_file(checkpoint_file(dir, "model.safetensors"),
                  partial_folder(dir) + "/model.safetensors");
    commit_checkpoint(dir, 2);
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("the checkpoint of step 2 in '" + dir +
                                 "' has no train_state.safetensors"));
    // A run directory without its vocabulary.
    run_once(dir, 2);
    fs::remove(dir + "/vocab.txt");
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("[resume] '" + dir + "' has no vocab.txt"));
}

TEST_CASE("a new run refuses a folder holding files it did not write, naming one, touching none",
          "[run_dir]") {
    const std::string dir = "/tmp/fg_rd_new";
    std::ostringstream log;
    // Another program's files (even with names a run uses), without the run marker.
    for (const char* f : {"metrics.jsonl", "notes.txt", "config.yaml"}) {
        fs::remove_all(dir);
        fs::create_directories(dir);
        std::ofstream(dir + "/" + f) << "a user's file\n";
        const auto before = test::files_under(dir);
        REQUIRE_THROWS_WITH(Trainer(tiny(dir, 2), log),
                            ContainsSubstring(std::string("holds '") + f + "', which fusegrad did not write") &&
                                ContainsSubstring("never writes over or removes files it did not write"));
        CHECK(test::files_under(dir) == before);
        CHECK_FALSE(fs::exists(dir + "/" + kRunMarker));
    }
    // A failed start's directory with a user's file beside it: still refused, nothing removed.
    fs::remove_all(dir);
    { Trainer t(tiny(dir, 2), log); }  // a start that stopped before its first checkpoint
    fs::create_directories(dir + "/checkpoints");
    std::ofstream(dir + "/checkpoints/my_notes.txt") << "mine\n";
    const auto before = test::files_under(dir);
    REQUIRE_THROWS_WITH(Trainer(tiny(dir, 2), log),
                        ContainsSubstring("holds 'checkpoints', which a start of fusegrad's does not leave"));
    CHECK(test::files_under(dir) == before);
    // A committed run: resume it instead.
    run_once(dir, 2);
    REQUIRE_THROWS_WITH(Trainer(tiny(dir, 2), log),
                        ContainsSubstring("already holds a run (checkpoint.json): resume it with --resume"));
    // train.out_dir naming a file.
    std::ofstream("/tmp/fg_rd_a_file") << "x";
    REQUIRE_THROWS_WITH(Trainer(tiny("/tmp/fg_rd_a_file", 2), log),
                        ContainsSubstring("train.out_dir '/tmp/fg_rd_a_file' is not a directory"));
}

TEST_CASE("a start that stopped before its first checkpoint is taken over by the next",
          "[run_dir]") {
    const std::string dir = "/tmp/fg_rd_failed_start";
    fs::remove_all(dir);
    std::ostringstream log;
    {
        Trainer t(tiny(dir, 2), log);  // config.yaml, vocab.txt and the marker written
    }
    // What a kill between the first metrics line and the first commit leaves: a metrics line, a
    // half-written save and a temporary file.
    std::ofstream(dir + "/metrics.jsonl") << "{\"step\": 1, \"loss\": 9.5, \"planted\": true}\n";
    fs::create_directories(dir + "/checkpoints/.partial");
    std::ofstream(dir + "/checkpoints/.partial/model.safetensors.Ab12Cd.tmp") << "half";
    std::ofstream(dir + "/config.yaml.x1Y2z3.tmp") << "half";
    // --resume has nothing to resume, and says what to do.
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("holds no checkpoint") &&
                            ContainsSubstring("its run stopped before its first checkpoint; start it again"));
    std::ostringstream retry_log;
    Trainer retry(tiny(dir, 2), retry_log);
    CHECK_THAT(retry_log.str(),
               ContainsSubstring("note: taking over '" + dir + "': a start that stopped before its first "
                        "checkpoint left checkpoints, config.yaml, config.yaml.x1Y2z3.tmp, "
                        "metrics.jsonl, vocab.txt; they are replaced"));
    retry.run();
    CHECK(has_checkpoint(dir));
    std::ifstream metrics(dir + "/metrics.jsonl");
    std::string first;
    std::getline(metrics, first);
    CHECK(first.find("planted") == std::string::npos);  // the failed start's line is gone
    CHECK_FALSE(fs::exists(dir + "/config.yaml.x1Y2z3.tmp"));
}

TEST_CASE("sample and eval load weights as --resume does: verified, finite, the model's names",
          "[run_dir]") {
    const std::string dir = "/tmp/fg_rd_load";
    run_once(dir, 4);
    CHECK(load_run(dir, false, Device::cpu).model != nullptr);
    // A flipped byte in the checkpoint's weights: refused by its checksum, as --resume refuses it.
    {
        std::fstream f(checkpoint_file(dir, "model.safetensors"),
                       std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(200);
        f.put('\x5a');
    }
    REQUIRE_THROWS_WITH(load_run(dir, false, Device::cpu),
                        ContainsSubstring("model.safetensors' does not match its checksum"));
    // Non-finite or foreign weights (best.safetensors has no manifest): refused by name.
    run_once(dir, 4);
    SafetensorsFile best = load_safetensors(dir + "/model.safetensors");
    best.tensors[0].second = Tensor::full(best.tensors[0].second.shape(), std::nan(""));
    save_safetensors(dir + "/best.safetensors", best.tensors, best.metadata);
    REQUIRE_THROWS_WITH(load_run(dir, true, Device::cpu),
                        ContainsSubstring("holds a non-finite value") &&
                            ContainsSubstring("'" + best.tensors[0].first + "'"));
    best = load_safetensors(dir + "/model.safetensors");
    best.tensors.emplace_back("extra.weight", Tensor::zeros({2}));
    save_safetensors(dir + "/best.safetensors", best.tensors, best.metadata);
    REQUIRE_THROWS_WITH(load_run(dir, true, Device::cpu),
                        ContainsSubstring("holds a tensor 'extra.weight' that the model does not have"));
    // A config.yaml asking for a model larger than the machine: refused before it is built.
    Config huge = load_config(dir + "/config.yaml");
    huge.model.n_layer = 200000;
    huge.model.n_embd = 4096;
    huge.model.n_head = 32;
    write_file_durably(dir + "/config.yaml", dump_config(huge), "test");
    REQUIRE_THROWS_WITH(load_run(dir, false, Device::cpu),
                        ContainsSubstring("[load] the model '" + dir + "/config.yaml' describes needs") &&
                            ContainsSubstring("for its weights, but cpu has"));
}

TEST_CASE("checkpoint metadata past what a run reaches is refused", "[run_dir]") {
    const std::string dir = run_once("/tmp/fg_rd_metadata", 4);
    std::ostringstream log;
    for (const auto& [key, value, message] :
         {std::tuple<std::string, std::string, std::string>{
              "step", "18446744073709551615", "metadata 'step' is 18446744073709551615, more than "
                                              "any run reaches"},
          {"optimizer_steps", "5", "optimizer_steps 5 is more than the step, 4"},
          {"data_offset", "9223372036854775808", "metadata 'data_offset' is "
                                                 "9223372036854775808, more than any run reaches"}}) {
        INFO(key);
        run_once(dir, 4);
        // The legacy layout (as an older fusegrad wrote it: both files at the top, no manifest,
        // no checksums): only the values themselves can be checked.
        SafetensorsFile state = load_safetensors(checkpoint_file(dir, "train_state.safetensors"));
        SafetensorsFile model = load_safetensors(checkpoint_file(dir, "model.safetensors"));
        fs::remove(dir + "/checkpoint.json");
        state.metadata[key] = value;
        if (key == "step") model.metadata["step"] = value;
        save_safetensors(dir + "/train_state.safetensors", state.tensors, state.metadata);
        save_safetensors(dir + "/model.safetensors", model.tensors, model.metadata);
        REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log), ContainsSubstring(message));
    }
}

TEST_CASE("a checkpoint removes only the folder the one before it named", "[run_dir]") {
    const std::string dir = run_once("/tmp/fg_rd_cleanup", 2);
    const std::string first = verified_checkpoint(dir).folder;
    // A user's files in checkpoints/, and a folder named like a checkpoint no manifest named.
    std::ofstream(dir + "/checkpoints/notes.txt") << "mine\n";
    fs::create_directories(dir + "/checkpoints/my_backup");
    fs::create_directories(dir + "/checkpoints/step_99999999");
    std::ostringstream log;
    auto t = Trainer::resume(dir, {"train.steps=4"}, log);
    t->run();
    CHECK(verified_checkpoint(dir).folder != first);
    CHECK_FALSE(fs::exists(dir + "/" + first));  // the replaced checkpoint
    CHECK(fs::exists(dir + "/checkpoints/notes.txt"));
    CHECK(fs::exists(dir + "/checkpoints/my_backup"));
    CHECK(fs::exists(dir + "/checkpoints/step_99999999"));
    CHECK(is_step_folder_name("step_00000012"));
    CHECK(is_step_folder_name("step_00000012.3"));
    CHECK_FALSE(is_step_folder_name("step_12"));
    CHECK_FALSE(is_step_folder_name("step_00000012."));
    CHECK_FALSE(is_step_folder_name("step_00000012.x"));
    CHECK_FALSE(is_step_folder_name("../step_00000012"));
}

TEST_CASE("no write follows a planted link, and appends go to a regular file fusegrad made",
          "[run_dir]") {
    const std::string dir = "/tmp/fg_rd_links", victim = "/tmp/fg_rd_links_victim";
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(victim) << "precious\n";
    auto victim_text = [&] {
        std::ifstream in(victim);
        return std::string((std::istreambuf_iterator<char>(in)), {});
    };
    // A link at the file's own name, and at the old fixed temporary name: the write replaces
    // the link at `path` with a file, and never opens what either link points to.
    fs::create_symlink(victim, dir + "/vocab.txt");
    fs::create_symlink(victim, dir + "/vocab.txt.tmp");
    write_file_durably(dir + "/vocab.txt", "abc", "test");
    CHECK(victim_text() == "precious\n");
    CHECK(fs::is_regular_file(fs::symlink_status(dir + "/vocab.txt")));
    // An append to a link (even a dangling one) is refused, naming it.
    fs::create_symlink(victim, dir + "/metrics.jsonl");
    REQUIRE_THROWS_WITH(append_line(dir + "/metrics.jsonl", "{}", "train"),
                        ContainsSubstring("cannot append to '" + dir + "/metrics.jsonl'") &&
                            ContainsSubstring("symbolic link"));
    fs::create_symlink("/tmp/fg_rd_links_nothing", dir + "/dangling.jsonl");
    REQUIRE_THROWS_WITH(append_line(dir + "/dangling.jsonl", "{}", "train"),
                        ContainsSubstring("symbolic link"));
    CHECK_FALSE(fs::exists("/tmp/fg_rd_links_nothing"));
    CHECK(victim_text() == "precious\n");
    // A FIFO is refused at once, not waited on.
    REQUIRE(::mkfifo((dir + "/fifo.jsonl").c_str(), 0644) == 0);
    REQUIRE_THROWS_WITH(append_line(dir + "/fifo.jsonl", "{}", "train"),
                        ContainsSubstring("cannot append to '" + dir + "/fifo.jsonl'"));
    // A new run's directory holding a planted link is refused before anything is written.
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::create_symlink(victim, dir + "/metrics.jsonl");
    std::ostringstream log;
    REQUIRE_THROWS_WITH(Trainer(tiny(dir, 2), log),
                        ContainsSubstring("holds 'metrics.jsonl', which fusegrad did not write"));
    CHECK(victim_text() == "precious\n");
}

TEST_CASE("a failed best save says so and keeps the last checkpoint", "[run_dir]") {
    // best.safetensors cannot be written (a folder is in its place): the run stops and says
    // whether a checkpoint stays. (The folder is put there after the run has claimed the
    // directory.) The evaluation at step 2 comes before that step's checkpoint.
    const std::string dir = "/tmp/fg_rd_best";
    for (std::int64_t every : {2, 1}) {
        INFO("a checkpoint every " << every << " steps");
        fs::remove_all(dir);
        std::ostringstream log;
        Config c = tiny(dir, 4);
        c.train.eval_interval = 2;
        c.train.checkpoint_interval = every;
        Trainer t(c, log);
        fs::create_directories(dir + "/best.safetensors");
        const std::string kept = every == 1 ? "the last good checkpoint in '" + dir + "' is kept"
                                            : "no checkpoint was written before it";
        REQUIRE_THROWS_WITH(t.run(), ContainsSubstring("[checkpoint] saving the best weights at "
                                                       "step 2 failed") &&
                                         ContainsSubstring(kept));
        CHECK(has_checkpoint(dir) == (every == 1));
    }
    // The kept checkpoint (step 1) resumes.
    fs::remove_all(dir + "/best.safetensors");
    CHECK(verified_checkpoint(dir).step == 1);
    std::ostringstream log;
    std::unique_ptr<Trainer> resumed = Trainer::resume(dir, {}, log);
    CHECK(resumed->step() == 1);
}

TEST_CASE("a run too large for the device's memory is refused before anything is written",
          "[run_dir]") {
    // Estimates past 2^64 bytes print as what they are (they wrapped to "0 B" through size_t).
    CHECK(format_bytes(1e20) == "9.09e+07 TiB");
    CHECK(format_bytes(512.0) == "512 B");
    CHECK(format_bytes(static_cast<std::size_t>(3) << 30) == "3.00 GiB");
    const std::string dir = "/tmp/fg_rd_memory";
    fs::remove_all(dir);
    std::ostringstream log;
    Config c = tiny(dir, 2);
    c.train.batch_size = 1000000000000;  // terabytes of activations
    REQUIRE_THROWS_WITH(Trainer(c, log),
                        ContainsSubstring("[train] one step of this run needs about") &&
                            ContainsSubstring("TiB: parameters") && ContainsSubstring("activations") &&
                            ContainsSubstring("(train.batch_size 1000000000000 x ") &&
                            ContainsSubstring("available: reduce train.batch_size"));
    CHECK_FALSE(fs::exists(dir));
    // Switched off, the check lets the run be built (it would fail at its first batch).
    c.train.memory_check = false;
    Trainer unchecked(c, log);
    CHECK(fs::exists(dir + "/config.yaml"));
    // A run that fits logs its estimate.
    fs::remove_all(dir);
    std::ostringstream fits;
    Trainer t(tiny(dir, 2), fits);
    CHECK_THAT(fits.str(), ContainsSubstring("memory per step (estimated): "));
}

TEST_CASE("leftovers of an interrupted save block nothing", "[run_dir]") {
    const std::string dir = run_once("/tmp/fg_rd_leftovers", 4);
    for (const char* f : {"config.yaml.tmp", "vocab.txt.tmp", "checkpoint.json.tmp",
                          "model.safetensors.tmp"})
        std::ofstream(dir + "/" + f) << "half written";
    fs::create_directories(dir + "/checkpoints/.partial");
    std::ofstream(dir + "/checkpoints/.partial/model.safetensors.tmp") << "half";
    // What a kill leaves now: temporaries of new names, and a step folder (with fusegrad's
    // marker) renamed into checkpoints/ before its manifest was written.
    for (const char* f : {"config.yaml.Ab12Cd.tmp", "model.safetensors.q9Z8y7.tmp",
                          "checkpoint.json.x0x0x0.tmp"})
        std::ofstream(dir + "/" + f) << "half written";
    fs::create_directories(dir + "/checkpoints/step_00000005");
    std::ofstream(dir + "/checkpoints/step_00000005/.fusegrad-checkpoint") << "ours\n";
    std::ostringstream log;
    auto t = Trainer::resume(dir, {"train.steps=6"}, log);
    t->run();
    CHECK(t->step() == 6);
    CHECK_FALSE(fs::exists(dir + "/checkpoints/.partial"));
    CHECK_FALSE(fs::exists(dir + "/checkpoints/step_00000005"));
    for (const auto& e : fs::directory_iterator(dir))
        CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
    CHECK(fs::is_regular_file(fs::path(dir) / verified_checkpoint(dir).folder / ".fusegrad-checkpoint"));
}

TEST_CASE("a non-finite loss stops the run before the update, keeping the last checkpoint",
          "[run_dir]") {
    const std::string dir = "/tmp/fg_rd_nan";
    fs::remove_all(dir);
    Config c = tiny(dir, 50);
    c.optim.lr = 1e300;  // finite, so the config takes it; the first update ruins the weights
    c.optim.grad_clip = 0.0;
    c.optim.warmup_steps = 0;
    c.train.checkpoint_interval = 1;
    std::ostringstream log;
    Trainer t(c, log);
    REQUIRE_THROWS_WITH(t.run(), ContainsSubstring("[train] the training loss at step 2 is") &&
                                     ContainsSubstring("stopped before updating the weights"));
    CHECK(t.step() == 1);
    REQUIRE(has_checkpoint(dir));
    CHECK(verified_checkpoint(dir).step == 1);  // the last checkpoint, of a finite step
}

TEST_CASE("resume refuses a vocabulary that changed", "[run_dir]") {
    const std::string dir = run_once("/tmp/fg_rd_vocab", 2);
    { std::ofstream(dir + "/vocab.txt") << "0123456789+="; }
    const auto before = test::files_under(dir);
    std::ostringstream log;
    REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log),
                        ContainsSubstring("is not the one in '" + dir + "/vocab.txt'"));
    CHECK(test::files_under(dir) == before);
}

TEST_CASE("damaged train_state metadata is named, not 'stoull' or 'map::at'", "[run_dir]") {
    std::ostringstream log;
    for (const auto& [key, value, expected] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"step", "-1", "metadata 'step' is '-1', not a whole number >= 0"},
             {"data_offset", "12x", "metadata 'data_offset' is '12x', not a whole number >= 0"},
             {"dropout_seed", "", "lacks 'dropout_seed' in its metadata"},
             {"best_val", "low", "best_val is 'low', not a number"},
             {"best_val", "", "lacks 'best_val'"}}) {
        INFO(key << " = [" << value << "]");
        const std::string dir = run_once("/tmp/fg_rd_meta", 2);
        const std::string k = key, v = value;  // (C++17 lambdas cannot capture bindings)
        commit_edited(dir, 2, [&k, &v](SafetensorsFile&, SafetensorsFile& state) {
            if (v.empty()) state.metadata.erase(k);
            else state.metadata[k] = v;
        });
        REQUIRE_THROWS_WITH(Trainer::resume(dir, {}, log), ContainsSubstring(expected));
    }
}

TEST_CASE("a shape too large to count is an error, not an overflow", "[run_dir][errors]") {
    REQUIRE_THROWS_WITH(shape_numel({std::int64_t{1} << 62, 8}),
                        ContainsSubstring("[tensor] shape") &&
                            ContainsSubstring("more elements than a 64-bit count"));
    REQUIRE_THROWS_WITH(shape_numel({3, -2}),
                        ContainsSubstring("[tensor] shape (3, -2) has a negative dim"));
}
