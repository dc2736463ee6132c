// cli/main.cpp: the `fusegrad` command. Its commands and their options are declared with CLI11
// (`fusegrad --help`, `fusegrad COMMAND --help`); each command's body is a few calls into train/,
// into cli/'s other files (demo, prepare, export / import, hellaswag), or into kernels/norm/ for
// norm-plan. The only place that reports an error and exits: it prints "error: ..." once and exits
// 2 for what CLI11 refuses (an unknown command or option, a bad value), 1 for any other error, 130
// when a run is stopped by a signal; with --ranks, a failed rank's status.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "demo.h"
#include "hellaswag.h"
#include "hf_gpt2.h"
#include "launch_ranks.h"
#include "norm_plan.h"
#include "plot.h"
#include "prepare.h"
#include "scale/scale_backend.h"
#include "scale/scale_wing.h"
#include "text/gpt2_bpe.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

bool g_progress_bar = false;  // the trainer draws one (train, on a terminal)

const std::vector<std::string> kDevices{"auto", "cpu", "cuda"};

fg::Device parse_device(const std::string& value) {
    if (value == "cpu") return fg::Device::cpu;
    if (value == "cuda") {
        fg::cuda_backend("--device cuda");  // a clear error when there is no GPU
        return fg::Device::cuda;
    }
    return fg::cuda_is_available() ? fg::Device::cuda : fg::Device::cpu;  // auto
}

// `--device auto|cpu|cuda` on `command`.
CLI::Option* add_device(CLI::App* command, std::string& device) {
    return command->add_option("--device", device, "where to run: auto (a GPU if there is one), "
                               "cpu or cuda")
        ->check(CLI::IsMember(kDevices))
        ->capture_default_str();
}

// A validator of numbers above `low` (or at least `low`): finite, and the message names the bound.
CLI::Validator number_above(double low, bool or_equal) {
    const std::string bound = (or_equal ? ">= " : "> ") + CLI::detail::to_string(low);
    return CLI::Validator(
        [=](std::string& text) -> std::string {
            double v = 0.0;
            const bool ok = CLI::detail::lexical_cast(text, v) && std::isfinite(v) &&
                            (or_equal ? v >= low : v > low);
            return ok ? "" : "needs a finite number " + bound + ", got '" + text + "'";
        },
        "NUMBER " + bound);
}

// `fusegrad info`.
int info() {
    std::printf("fusegrad 0.1.0, built %s CUDA\n", fg::built_with_cuda() ? "with" : "without");
    if (!fg::cuda_is_available()) {
        std::printf("cuda device: none\n");
        return 0;
    }
    fg::CudaBackend& cuda = fg::cuda_backend("info");
    fg::CudaDeviceInfo d = cuda.device_info();
    std::printf("cuda device: %s, %d SMs, %.1f GiB\n", d.name.c_str(), d.sm_count,
                d.total_bytes / (1024.0 * 1024 * 1024));
    const std::string why = fg::cudnn_attention_unsupported({fg::Device::cuda, fg::DType::bf16, 64});
    std::printf("cuDNN attention: %s\n", why.empty() ? "available" : why.c_str());
    fg::ScaleBackend& scale = fg::scale_backend("info");
    const std::string no_nccl = scale.nccl_unavailable();
    std::printf("NCCL (several GPUs): %s\n",
                no_nccl.empty() ? scale.nccl_version().c_str() : no_nccl.c_str());
    return 0;
}

struct TrainArgs {
    std::string config, resume;
    std::vector<std::string> overrides;
    long max_steps = -1;  // stop early; the schedule still spans train.steps
    long ranks = 0;       // launch this many ranks of the command
};

// `fusegrad train`. `args` is the whole command line, passed on to the ranks without --ranks.
int train(const TrainArgs& a, const std::vector<std::string>& args) {
    FG_CHECK(a.config.empty() != a.resume.empty(), "cli",
             "train takes a config file or --resume RUN_DIR (one of them)");
    if (a.ranks > 0) {
        FG_CHECK(std::getenv("WORLD_SIZE") == nullptr, "cli", "--ranks starts its own ranks, "
                 "but WORLD_SIZE is already set (this process is a rank of another launch)");
        std::vector<std::string> rank_args;
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (args[i] == "--ranks") ++i;  // and its value
            else if (args[i].rfind("--ranks=", 0) != 0) rank_args.push_back(args[i]);
        }
        return fg::cli::launch_ranks(a.ranks, rank_args);
    }
    // Ctrl-C, and the SIGTERM a scheduler sends before it kills: finish the step, save, exit.
    std::signal(SIGINT, [](int) { fg::Trainer::request_stop(); });
    std::signal(SIGTERM, [](int) { fg::Trainer::request_stop(); });
    std::unique_ptr<fg::Trainer> trainer =
        a.resume.empty()
            ? std::make_unique<fg::Trainer>(fg::load_config(a.config, a.overrides), std::cout,
                                            std::make_unique<fg::ScaleWing>())
            : fg::Trainer::resume(a.resume, a.overrides, std::cout,
                                  std::make_unique<fg::ScaleWing>());
    g_progress_bar = isatty(STDOUT_FILENO) == 1;
    trainer->set_progress_bar(g_progress_bar);
    trainer->run(a.max_steps);
    if (trainer->writer()) {  // the run's loss curves, its whole history when it was resumed
        const std::string& dir = trainer->run_dir();
        fg::write_loss_curves({{"", dir + "/metrics.jsonl"}}, dir + "/loss_curve.svg",
                              "fusegrad: " + dir);
    }
    return fg::Trainer::stop_requested() ? 130 : 0;
}

struct SampleArgs {
    std::string run_dir, prompt, device = "auto";
    long max_new = 64, top_k = 0;
    unsigned long long seed = 0;
    double temperature = 1.0;
    bool best = false;
    bool ids = false;  // a GPT-2 token run's prompt and output as ids, not text
    std::string hellaswag;  // eval: a HellaSwag JSONL file to score instead of the losses
    long limit = 0;         // eval --hellaswag: the first this many examples (0: all)
};

// What sample and eval both take: the run directory, --best and --device.
void add_run_options(CLI::App* command, SampleArgs& a) {
    command->add_option("run_dir", a.run_dir, "the run directory")->required();
    command->add_flag("--best", a.best, "the best validation checkpoint, not the latest");
    add_device(command, a.device);
}

// `fusegrad sample`.
int sample(const SampleArgs& a, bool prompt_given) {
    FG_CHECK(!prompt_given || !a.prompt.empty(), "cli", "--prompt is empty; give some text");
    const fg::Device device = parse_device(a.device);
    fg::LoadedModel run = fg::load_run(a.run_dir, a.best, device);
    std::string prompt = a.prompt;
    if (prompt.empty() && run.config.data.kind == fg::DataKind::addition) prompt = "12+34=";
    FG_CHECK(!prompt.empty(), "cli", "sample needs --prompt TEXT");
    // A run on GPT-2's tokens (vocab.txt "tokens: gpt2 ...") reads and writes text through GPT-2's
    // tokenizer, unless --ids; other token runs, and --ids, take and print ids.
    const bool gpt2_text = !a.ids && run.vocab.chars().rfind("tokens: gpt2 ", 0) == 0;
    std::unique_ptr<fg::text::Gpt2Tokenizer> bpe;
    if (gpt2_text)
        bpe = std::make_unique<fg::text::Gpt2Tokenizer>(fg::text::Gpt2Tokenizer::load_installed());
    std::vector<std::int32_t> ids = bpe ? bpe->encode(prompt) : run.vocab.encode(prompt, "prompt");
    FG_CHECK(!ids.empty(), "cli", "--prompt encodes to no tokens");
    fg::Generator gen(a.seed);
    fg::Tensor start = fg::Tensor::from_vector(ids, {1, (std::int64_t)ids.size()}, device);
    fg::Tensor out = fg::generate(*run.model, start, a.max_new, a.temperature, a.top_k, gen,
                                  run.vocab.size());
    const std::vector<std::int32_t> all = out.to_vector<std::int32_t>();
    std::printf("%s\n", (bpe ? bpe->decode(all) : run.vocab.decode(all)).c_str());
    return 0;
}

// `fusegrad eval --hellaswag FILE`: the run's answers to HellaSwag's examples (hellaswag.h), its
// text encoded as the run's data was: GPT-2's tokens or the run's characters.
int eval_hellaswag(const SampleArgs& a, fg::LoadedModel& run, fg::Device device) {
    std::function<std::vector<std::int32_t>(const std::string&)> encode;
    std::unique_ptr<fg::text::Gpt2Tokenizer> bpe;
    if (run.vocab.chars().rfind("tokens: gpt2 ", 0) == 0) {
        bpe = std::make_unique<fg::text::Gpt2Tokenizer>(fg::text::Gpt2Tokenizer::load_installed());
        encode = [&bpe](const std::string& text) { return bpe->encode(text); };
    } else {
        FG_CHECK(!run.vocab.is_tokens(), "eval", "--hellaswag reads text: '", a.run_dir,
                 "' was trained on ", run.vocab.chars().substr(0, run.vocab.chars().find('\n')),
                 ", not on characters or GPT-2's tokens");
        encode = [&run](const std::string& text) {
            return run.vocab.encode(text, "a HellaSwag text");
        };
    }
    const std::vector<fg::cli::ChoiceExample> examples =
        fg::cli::read_hellaswag(a.hellaswag, a.limit, encode);
    const fg::cli::ChoiceScore s = fg::cli::score_choices(
        *run.model, examples, device, [](std::int64_t done, std::int64_t total) {
            if (done % 1000 == 0)
                std::fprintf(stderr, "hellaswag: %lld of %lld examples\n", (long long)done,
                             (long long)total);
        });
    std::printf("hellaswag: %lld examples, acc %.4f (the lowest summed loss), acc_norm %.4f (the "
                "lowest mean loss a token)\n",
                (long long)s.examples, (double)s.correct / s.examples,
                (double)s.correct_norm / s.examples);
    if (s.shortened > 0)
        std::printf("hellaswag: contexts cut to their last tokens to fit block_size: %lld\n",
                    (long long)s.shortened);
    return 0;
}

// `fusegrad eval`: reads the run directory, writes nothing.
int eval(const SampleArgs& a) {
    const fg::Device device = parse_device(a.device);
    fg::LoadedModel run = fg::load_run(a.run_dir, a.best, device);
    if (!a.hellaswag.empty()) return eval_hellaswag(a, run, device);
    fg::require_data_files(run.config, a.run_dir);
    std::unique_ptr<fg::Dataset> data = fg::make_dataset(run.config);
    FG_CHECK(data->vocab().chars() == run.vocab.chars(), "eval", "the data's vocabulary (",
             data->vocab().size(), " tokens) is not the one in '", a.run_dir, "/vocab.txt' (",
             run.vocab.size(), " tokens): did the data file change?");
    // Bits per byte where a token's bytes are known: a character is one byte of the text, a GPT-2
    // token its bytes through GPT-2's tokenizer; other tokenizers' runs have none.
    std::function<std::int64_t(std::int32_t)> token_bytes;
    std::unique_ptr<fg::text::Gpt2Tokenizer> bpe;
    if (!run.vocab.is_tokens() && run.config.data.kind == fg::DataKind::text) {
        token_bytes = [](std::int32_t) { return std::int64_t{1}; };
    } else if (run.vocab.chars().rfind("tokens: gpt2 ", 0) == 0) {
        bpe = std::make_unique<fg::text::Gpt2Tokenizer>(fg::text::Gpt2Tokenizer::load_installed());
        token_bytes = [&bpe](std::int32_t id) {
            return static_cast<std::int64_t>(bpe->token_bytes(id).size());
        };
    }
    fg::EvalResult e = fg::evaluate_model(*run.model, *data, run.config, device, {}, token_bytes);
    std::printf("train loss %.4f, val loss %.4f", e.train_loss, e.val_loss);
    if (e.val_bits_per_byte >= 0) std::printf(" (%.4f bits per byte)", e.val_bits_per_byte);
    if (e.accuracy >= 0) std::printf(", held-out exact match %.1f%%", 100 * e.accuracy);
    std::printf("\n");
    return 0;
}

struct PlotArgs {
    std::string out, title = "loss";
    std::vector<std::string> sources;
    double y_max = 0.0;
};

// `fusegrad plot`.
int plot(const PlotArgs& a) {
    std::vector<fg::LossCurveSource> runs;
    for (const std::string& s : a.sources) {
        const std::size_t eq = s.find('=');
        FG_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < s.size(), "cli",
                 "plot takes LABEL=METRICS.jsonl, got '", s, "'");
        runs.push_back({s.substr(0, eq), s.substr(eq + 1)});
    }
    fg::write_loss_curves(runs, a.out, a.title, a.y_max);
    return 0;
}

struct ConfigArgs {
    std::string config;
    std::vector<std::string> overrides;
    bool list = false;
};

// Every key, section by section, with its default, meaning and whether a resume may change it.
std::string describe_config_keys() {
    std::ostringstream out;
    std::string section;
    for (const fg::ConfigKey& k : fg::config_keys()) {
        const std::string s = k.key.substr(0, k.key.find('.'));
        if (s != section) out << (section.empty() ? "" : "\n") << s << ":\n";
        section = s;
        out << "  " << k.key.substr(s.size() + 1) << ": " << k.default_value
            << (k.resumable ? "  (a resume may change it)" : "") << "\n      " << k.description
            << "\n";
    }
    return out.str();
}

// `fusegrad config`: the schema's keys, or a config file checked and resolved.
int config(const ConfigArgs& a) {
    FG_CHECK(a.list != !a.config.empty(), "cli",
             "config takes --list or a config file (one of them)");
    if (a.list) std::fputs(describe_config_keys().c_str(), stdout);
    else std::fputs(fg::dump_config(fg::load_config(a.config, a.overrides)).c_str(), stdout);
    return 0;
}

struct NormPlanArgs {
    long long rows = 16384, cols = 0;
    std::string norm = "layer", dtype = "bf16", weights = "f32", gpu = "h100";
    std::string weight = "yes", bias, residual = "no", dh = "no", zero_centered = "no";
    std::string misaligned = "no", reduction = "auto";
};

// `fusegrad norm-plan`: norm_plan.h's account of one call's plan.
int norm_plan(const NormPlanArgs& a) {
    namespace np = fg::kernels::norm_plan;
    using fg::kernels::NormKind;
    using fg::kernels::NormReduction;
    np::NormCall call;
    call.rows = a.rows;
    call.cols = a.cols;
    call.kind = a.norm == "rms" ? NormKind::rms : NormKind::layer;
    call.elem_bytes = a.dtype == "f32" ? 4 : 2;
    call.weight = a.weight == "yes";
    // LayerNorm modules have a bias and RMSNorm ones do not, unless told otherwise.
    call.bias = a.bias.empty() ? call.kind == NormKind::layer : a.bias == "yes";
    call.residual = a.residual == "yes";
    call.dh = a.dh == "yes";
    call.zero_centered = a.zero_centered == "yes";
    call.partials = true;
    call.reduction = a.reduction == "grid"     ? NormReduction::grid
                     : a.reduction == "locked" ? NormReduction::locked
                                               : NormReduction::automatic;
    call.weight_bytes = a.weights == "f32" ? 4 : call.elem_bytes;
    call.vector_ok = a.misaligned == "no" && call.cols % (16 / call.elem_bytes) == 0;
    np::NormDevice device;
    try {
        device = np::norm_device_named(a.gpu);
    } catch (const std::invalid_argument& e) {
        fg::fail("norm-plan", "--gpu: ", e.what());
    }
    std::printf("%s %s, %lld x %lld, weights %s%s%s%s%s, %s 16-byte vectors, on %s:\n",
                call.kind == NormKind::rms ? "rmsnorm" : "layernorm", a.dtype.c_str(), call.rows,
                call.cols, call.weight_bytes == 4 ? "f32" : a.dtype.c_str(),
                call.weight ? "" : ", no weight", call.bias ? ", bias" : "",
                call.residual ? ", fused residual" : "", call.dh ? ", dh" : "",
                call.vector_ok ? "with" : "without", a.gpu.c_str());
    std::fputs(np::explain_plan(call, device, fg::kernels::NormTuning{}).c_str(), stdout);
    return 0;
}

// The command line, parsed; the chosen command's body is run by the caller.
int run(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    CLI::App app{"fusegrad: train a GPT from a YAML config, sample and evaluate it, and more.",
                 "fusegrad"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "every command's options");

    TrainArgs t;
    CLI::App* train_cmd = app.add_subcommand(
        "train", "train a GPT from a YAML config, or resume a run (Ctrl-C or SIGTERM saves a "
                 "checkpoint and stops)");
    train_cmd->add_option("config", t.config, "the config file (configs/*.yaml)");
    train_cmd->add_option("--resume", t.resume, "go on with the run in this directory")
        ->excludes(train_cmd->get_option("config"));
    train_cmd->add_option("--set", t.overrides,
                          "change a config key, key.path=value (repeatable; on --resume, only "
                          "the keys a resume may change)")
        ->allow_extra_args(false);
    train_cmd->add_option("--max-steps", t.max_steps,
                          "stop after this step, the schedule unchanged (--resume goes on)")
        ->check(CLI::Range(1L, 1000000000L));
    train_cmd->add_option("--ranks", t.ranks,
                          "start this many processes on this host, each a share of every batch "
                          "(data parallel); a rank that fails stops the others")
        ->check(CLI::Range(1L, 1024L));

    SampleArgs s;
    CLI::App* sample_cmd =
        app.add_subcommand("sample", "continue a prompt with a trained model");
    add_run_options(sample_cmd, s);
    CLI::Option* prompt = sample_cmd->add_option(
        "--prompt", s.prompt, "the text to continue (GPT-2 token runs: text, through GPT-2's "
                              "tokenizer; other token runs and --ids: ids separated by spaces; "
                              "the addition task: 12+34= if not given)");
    sample_cmd->add_option("--max-new-tokens", s.max_new, "tokens to generate")
        ->check(CLI::Range(1L, 1000000L))
        ->capture_default_str();
    sample_cmd->add_option("--temperature", s.temperature,
                           "divides the logits before sampling; 0 is greedy")
        ->check(number_above(0, true))
        ->capture_default_str();
    sample_cmd->add_option("--top-k", s.top_k, "sample among the k likeliest tokens (0: all)")
        ->check(CLI::Range(0L, 1000000000L))
        ->capture_default_str();
    sample_cmd->add_option("--seed", s.seed, "the sampling generator's seed")
        ->capture_default_str();
    sample_cmd->add_flag("--ids", s.ids,
                         "GPT-2 token runs: the prompt and the output as ids, not text");

    SampleArgs e;
    CLI::App* eval_cmd = app.add_subcommand(
        "eval", "train and validation loss of a run (bits per byte for text, held-out accuracy "
                "for addition)");
    add_run_options(eval_cmd, e);
    CLI::Option* hellaswag = eval_cmd->add_option(
        "--hellaswag", e.hellaswag,
        "score HellaSwag's examples instead (a JSONL file you downloaded: ctx, endings, label; "
        "acc and acc_norm as llm.c counts them)");
    eval_cmd->add_option("--limit", e.limit, "--hellaswag: the first N examples (0: all)")
        ->needs(hellaswag)
        ->check(CLI::NonNegativeNumber);

    PlotArgs p;
    CLI::App* plot_cmd = app.add_subcommand(
        "plot", "train and validation loss of one or more runs on the same axes, as SVG");
    plot_cmd->add_option("out", p.out, "the SVG file to write")->required();
    plot_cmd->add_option("runs", p.sources, "LABEL=METRICS.jsonl, one a run (runs under one label, such as seeds, share a colour)")->required();
    plot_cmd->add_option("--title", p.title, "the plot's title")->capture_default_str();
    plot_cmd->add_option("--y-max", p.y_max, "the top of the loss axis (default: the data's)")
        ->check(number_above(0, false));

    std::string hf_dir, hf_run;
    bool hf_best = false;
    CLI::App* export_cmd = app.add_subcommand(
        "export", "a run's GPT-2 weights in Hugging Face's layout (transformers' GPT2LMHeadModel)");
    export_cmd->add_option("run_dir", hf_run, "the run directory")->required();
    export_cmd->add_option("--hf", hf_dir, "the folder to write model.safetensors and "
                           "config.json into (never over either)")->required();
    export_cmd->add_flag("--best", hf_best, "the best validation checkpoint, not the latest");
    CLI::App* import_cmd = app.add_subcommand(
        "import", "a run directory from GPT-2 weights in Hugging Face's layout, to sample, "
        "evaluate or train on");
    import_cmd->add_option("--hf", hf_dir, "a transformers GPT-2 folder (config.json and "
                           "model.safetensors, as save_pretrained writes them)")->required();
    import_cmd->add_option("--out", hf_run, "the run directory to make (new or empty)")
        ->required();

    fg::DemoOptions d;
    std::string demo_device = "auto";
    CLI::App* demo_cmd = app.add_subcommand(
        "demo", "train a small MLP with fusegrad's autograd (a tour of the core)");
    add_device(demo_cmd, demo_device);
    demo_cmd->add_option("--steps", d.steps, "SGD steps")
        ->check(CLI::Range(1, 10000000))
        ->capture_default_str();
    demo_cmd->add_option("--seed", d.seed, "the task's and the weights' seed")
        ->capture_default_str();

    ConfigArgs c;
    CLI::App* config_cmd = app.add_subcommand(
        "config", "every config key with its default and meaning (--list), or a config file's "
                  "keys, types and values checked as train reads them (train also checks the "
                  "data, memory and devices) and the config printed resolved");
    CLI::Option* list = config_cmd->add_flag(
        "--list", c.list, "every key: its default, its meaning and whether a resume may change it");
    config_cmd->add_option("config", c.config, "a config file (configs/*.yaml)")->excludes(list);
    config_cmd->add_option("--set", c.overrides, "change a key, key.path=value (repeatable)")
        ->allow_extra_args(false)
        ->excludes(list);

    fg::cli::PrepareOptions pr;
    CLI::App* prepare_cmd = app.add_subcommand(
        "prepare", "text files (or folders of them, or .jsonl files) to GPT-2 token shards that "
                   "data.kind shards trains on");
    prepare_cmd->add_option("inputs", pr.inputs, "text files (a document a file), .jsonl files (a "
                            "document a line) or folders of them (in name order)")->required();
    prepare_cmd->add_option("--out", pr.out_dir, "the folder the shards go to")->required();
    prepare_cmd->add_option("--name", pr.name, "the shards' name: NAME_train_000001.bin, ... and "
                            "NAME_val_000000.bin (raw_uint16: NAME_train.bin, NAME_val.bin)")
        ->capture_default_str();
    prepare_cmd->add_option("--format", pr.format, "llmc (llm.c's header) or raw_uint16 "
                            "(nanoGPT's headerless format)")
        ->check(CLI::IsMember({"llmc", "raw_uint16"}))
        ->capture_default_str();
    prepare_cmd->add_option("--val-share", pr.val_share, "the share of tokens for validation (the last)")
        ->check(CLI::Range(0.0001, 0.9999))
        ->capture_default_str();
    prepare_cmd->add_option("--shard-tokens", pr.shard_tokens, "tokens a training shard (llmc)")
        ->check(CLI::Range(std::int64_t{1024}, (std::int64_t{1} << 31) - 1))  // an int32 count
        ->capture_default_str();
    prepare_cmd->add_option("--jsonl-field", pr.jsonl_field, "the text's field in .jsonl lines")
        ->capture_default_str();
    prepare_cmd->add_option("--threads", pr.threads, "threads that encode (0: every core)")
        ->check(CLI::Range(0, 4096))
        ->capture_default_str();

    CLI::App* info_cmd =
        app.add_subcommand("info", "the build and the devices fusegrad can use");

    NormPlanArgs n;
    CLI::App* plan_cmd = app.add_subcommand(
        "norm-plan", "which fused norm kernels a call of this shape runs, and why (the rule "
                     "ids of docs/norms.md); needs no GPU");
    plan_cmd->add_option("--cols", n.cols, "the length of a row")
        ->required()
        ->check(CLI::Range(1LL, 1LL << 30));
    plan_cmd->add_option("--rows", n.rows, "rows")
        ->check(CLI::Range(1LL, 1LL << 40))
        ->capture_default_str();
    auto choice = [&](const char* flag, std::string& value, std::vector<std::string> allowed,
                      const char* help) {
        plan_cmd->add_option(flag, value, help)
            ->check(CLI::IsMember(std::move(allowed)))
            ->capture_default_str();
    };
    const std::vector<std::string> yes_no{"yes", "no"};
    choice("--norm", n.norm, {"rms", "layer"}, "RMSNorm or LayerNorm");
    choice("--dtype", n.dtype, {"bf16", "f16", "f32"}, "the input's dtype");
    choice("--weights", n.weights, {"f32", "input"}, "weights in f32 or in the input's dtype");
    choice("--weight", n.weight, yes_no, "a weight");
    choice("--bias", n.bias, yes_no, "a bias (default: LayerNorm yes, RMSNorm no)");
    choice("--residual", n.residual, yes_no, "the residual add fused in");
    choice("--dh", n.dh, yes_no, "a gradient for the residual sum too");
    choice("--zero-centered", n.zero_centered, yes_no, "the weight stored as w - 1");
    choice("--misaligned", n.misaligned, yes_no, "operands off a 16-byte boundary");
    choice("--reduction", n.reduction, {"auto", "grid", "locked"}, "the dw / db strategy");
    plan_cmd->add_option("--gpu", n.gpu, "h100, h200 or a100")->capture_default_str();

    if (args.empty()) {
        std::fputs(app.help().c_str(), stdout);
        return 2;
    }
    const std::vector<CLI::App*> commands = app.get_subcommands([](CLI::App*) { return true; });
    const bool known = std::any_of(commands.begin(), commands.end(),
                                   [&](CLI::App* c) { return c->check_name(args[0]); });
    if (args[0][0] != '-' && !known) {
        std::fprintf(stderr, "error: unknown command '%s' (fusegrad --help lists the commands)\n",
                     args[0].c_str());
        return 2;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
        const std::vector<CLI::App*> chosen = app.get_subcommands();
        std::fputs((chosen.empty() ? app.help() : chosen[0]->help()).c_str(), stdout);
        return 0;
    } catch (const CLI::CallForAllHelp&) {
        std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
        return 0;
    } catch (const CLI::ParseError& error) {
        const std::vector<CLI::App*> chosen = app.get_subcommands();
        const std::string help =
            chosen.empty() ? "fusegrad --help" : "fusegrad " + chosen[0]->get_name() + " --help";
        std::fprintf(stderr, "error: %s (%s lists the options)\n", error.what(), help.c_str());
        return 2;
    }
    if (train_cmd->parsed()) return train(t, args);
    if (sample_cmd->parsed()) return sample(s, prompt->count() > 0);
    if (eval_cmd->parsed()) return eval(e);
    if (plot_cmd->parsed()) return plot(p);
    if (export_cmd->parsed()) {
        fg::cli::export_hf_gpt2(hf_run, hf_best, hf_dir);
        std::printf("exported '%s' to '%s' (model.safetensors, config.json)\n", hf_run.c_str(),
                    hf_dir.c_str());
        return 0;
    }
    if (import_cmd->parsed()) {
        std::printf("%s\n", fg::cli::import_hf_gpt2(hf_dir, hf_run).c_str());
        return 0;
    }
    if (demo_cmd->parsed()) {
        d.device = parse_device(demo_device);
        fg::run_demo(d);
        return 0;
    }
    if (config_cmd->parsed()) return config(c);
    if (prepare_cmd->parsed()) {
        pr.progress = isatty(STDERR_FILENO) == 1;
        fg::cli::prepare(pr);
        return 0;
    }
    if (info_cmd->parsed()) return info();
    return norm_plan(n);
}

// On a terminal the progress bar may be the line the cursor is on: erase it first, so that an
// error is a line of its own, not the bar's tail.
void end_progress_line() {
    std::cout.flush();
    if (g_progress_bar) {
        std::fputs("\r\x1b[K", stdout);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::bad_alloc&) {
        end_progress_line();
        std::fprintf(stderr, "error: out of host memory (std::bad_alloc): reduce "
                             "train.batch_size, model.block_size or the model's size\n");
        return 1;
    } catch (const std::exception& e) {
        end_progress_line();
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
