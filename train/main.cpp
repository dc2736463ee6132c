// train/main.cpp: the `fusegrad` command. The only place that catches exceptions: it prints
// "error: ..." and exits non-zero. Subcommands: train, sample, eval, plot, demo, info.
#include <cerrno>
#include <csignal>
#include <new>
#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "demo.h"
#include "plot.h"
#include "trainer.h"

namespace {

const char* kUsage =
    "usage: fusegrad <command> [options]\n"
    "\n"
    "commands:\n"
    "  train CONFIG.yaml [--set key.path=value]... [--max-steps N]\n"
    "  train --resume RUN_DIR [--set key.path=value]... [--max-steps N]\n"
    "        train a GPT from a YAML config (Ctrl-C saves a checkpoint and stops; --max-steps\n"
    "        stops after step N with the schedule unchanged, and --resume goes on from there)\n"
    "  demo [--device auto|cpu|cuda] [--steps N] [--seed S]\n"
    "        train a small MLP with fusegrad's autograd (a tour of the core)\n"
    "  sample RUN_DIR [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K]\n"
    "         [--seed S] [--best] [--device auto|cpu|cuda]\n"
    "        continue a prompt with a trained model (temperature 0: greedy)\n"
    "  eval RUN_DIR [--best] [--device auto|cpu|cuda]\n"
    "        train and validation loss (and held-out accuracy for addition)\n"
    "  plot OUT.svg LABEL=METRICS.jsonl... [--title TEXT] [--y-max LOSS]\n"
    "        train and validation loss of one or more runs on the same axes\n"
    "  info  print the build and the devices fusegrad can use\n";

fg::Device parse_device(const std::string& value) {
    if (value == "cpu") return fg::Device::cpu;
    if (value == "cuda") {
        fg::cuda_backend("--device cuda");  // a clear error when there is no GPU
        return fg::Device::cuda;
    }
    if (value == "auto") return fg::cuda_is_available() ? fg::Device::cuda : fg::Device::cpu;
    fg::fail("cli", "--device must be auto, cpu or cuda, got '", value, "'");
}

// An integer in [low, high]; anything else (or out of long's range) names the flag.
long parse_int(const std::string& flag, const std::string& value, long low,
               long high = 1000000000L) {
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(value.c_str(), &end, 10);
    FG_CHECK(end && *end == '\0' && !value.empty() && errno == 0 && v >= low && v <= high, "cli",
             flag, " needs an integer from ", low, " to ", high, ", got '", value, "'");
    return v;
}

int run(const std::vector<std::string>& args) {
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
        std::fputs(kUsage, stdout);
        return args.empty() ? 2 : 0;
    }
    const std::string& command = args[0];
    if (command == "info") {
        std::printf("fusegrad 0.1.0, built %s CUDA\n", fg::built_with_cuda() ? "with" : "without");
        if (fg::cuda_is_available()) {
            fg::CudaDeviceInfo d = fg::cuda_backend("info").device_info();
            std::printf("cuda device: %s, %d SMs, %.1f GiB\n", d.name.c_str(), d.sm_count,
                        d.total_bytes / (1024.0 * 1024 * 1024));
            const std::string why =
                fg::cudnn_attention_unsupported(fg::Device::cuda, fg::DType::bf16, 64);
            std::printf("cuDNN attention: %s\n", why.empty() ? "available" : why.c_str());
        } else {
            std::printf("cuda device: none\n");
        }
        return 0;
    }
    if (command == "train") {
        std::string config, resume;
        std::vector<std::string> overrides;
        long max_steps = -1;  // stop early; the schedule still spans train.steps
        for (std::size_t i = 1; i < args.size(); ++i) {
            if (args[i] == "--set" || args[i] == "--resume") {
                FG_CHECK(i + 1 < args.size(), "cli", args[i], " needs a value");
                (args[i] == "--set" ? overrides.emplace_back() : resume) = args[i + 1];
                ++i;
            } else if (args[i] == "--max-steps") {
                FG_CHECK(i + 1 < args.size(), "cli", args[i], " needs a value");
                max_steps = parse_int(args[i], args[i + 1], 1);
                ++i;
            } else if (config.empty() && args[i].rfind("--", 0) != 0) {
                config = args[i];
            } else {
                fg::fail("cli", "unexpected argument '", args[i], "' for train");
            }
        }
        FG_CHECK(config.empty() != resume.empty(), "cli",
                 "train takes a config file or --resume RUN_DIR (one of them)");
        // Ctrl-C, and the SIGTERM a scheduler sends before it kills: finish the step, save, exit.
        std::signal(SIGINT, [](int) { fg::Trainer::request_stop(); });
        std::signal(SIGTERM, [](int) { fg::Trainer::request_stop(); });
        std::unique_ptr<fg::Trainer> trainer;
        if (resume.empty())
            trainer = std::make_unique<fg::Trainer>(fg::load_config(config, overrides), std::cout);
        else
            trainer = fg::Trainer::resume(resume, overrides, std::cout);
        trainer->set_progress_bar(isatty(STDOUT_FILENO) == 1);
        trainer->run(max_steps);
        return fg::Trainer::stop_requested() ? 130 : 0;
    }
    if (command == "sample" || command == "eval") {
        FG_CHECK(args.size() >= 2 && args[1].rfind("--", 0) != 0, "cli", command, " needs a run directory");
        std::string run_dir = args[1], prompt, device = "auto";
        bool prompt_given = false;
        long max_new = 64, top_k = 0, seed = 0;
        double temperature = 1.0;
        bool best = false;
        for (std::size_t i = 2; i < args.size(); ++i) {
            const std::string& flag = args[i];
            if (flag == "--best") {
                best = true;
                continue;
            }
            FG_CHECK(i + 1 < args.size(), "cli", flag, " needs a value");
            const std::string& value = args[++i];
            if (flag == "--prompt") {
                prompt = value;
                prompt_given = true;
            } else if (flag == "--max-new-tokens") max_new = parse_int(flag, value, 1, 1000000);
            else if (flag == "--top-k") top_k = parse_int(flag, value, 0);
            else if (flag == "--seed") seed = parse_int(flag, value, 0);
            else if (flag == "--device") device = value;
            else if (flag == "--temperature") {
                char* end = nullptr;
                temperature = std::strtod(value.c_str(), &end);
                FG_CHECK(end && *end == '\0' && temperature >= 0, "cli",
                         "--temperature needs a number >= 0, got '", value, "'");
            } else {
                fg::fail("cli", "unknown option '", flag, "' for ", command);
            }
        }
        FG_CHECK(!prompt_given || !prompt.empty(), "cli", "--prompt is empty; give some text");
        fg::Device dev = parse_device(device);
        if (command == "eval") {  // reads the run directory, writes nothing
            fg::LoadedModel run = fg::load_run(run_dir, best, dev);
            std::unique_ptr<fg::Dataset> data = fg::make_dataset(run.config);
            FG_CHECK(data->vocab().chars() == run.vocab.chars(), "eval", "the data's vocabulary (",
                     data->vocab().size(), " tokens) is not the one in '", run_dir,
                     "/vocab.txt' (", run.vocab.size(), " tokens): did the data file change?");
            fg::EvalResult e = fg::evaluate_model(*run.model, *data, run.config, dev);
            std::printf("train loss %.4f, val loss %.4f", e.train_loss, e.val_loss);
            if (e.accuracy >= 0) std::printf(", held-out exact match %.1f%%", 100 * e.accuracy);
            std::printf("\n");
            return 0;
        }
        fg::LoadedModel run = fg::load_run(run_dir, best, dev);
        if (prompt.empty() && run.config.data.kind == "addition") prompt = "12+34=";
        FG_CHECK(!prompt.empty(), "cli", "sample needs --prompt TEXT");
        std::vector<std::int32_t> ids = run.vocab.encode(prompt, "prompt");
        fg::Generator gen(static_cast<std::uint64_t>(seed));
        fg::Tensor out = fg::generate(*run.model,
                                      fg::Tensor::from_vector(ids, {1, (std::int64_t)ids.size()}, dev),
                                      max_new, temperature, top_k, gen, run.vocab.size());
        std::printf("%s\n", run.vocab.decode(out.to_vector<std::int32_t>()).c_str());
        return 0;
    }
    if (command == "plot") {
        FG_CHECK(args.size() >= 3, "cli", "plot needs OUT.svg and at least one LABEL=METRICS.jsonl");
        std::vector<fg::LossCurveSource> runs;
        std::string title = "loss";
        double y_max = 0.0;
        for (std::size_t i = 2; i < args.size(); ++i) {
            if (args[i] == "--title" || args[i] == "--y-max") {
                FG_CHECK(i + 1 < args.size(), "cli", args[i], " needs a value");
                if (args[i] == "--title") {
                    title = args[++i];
                    continue;
                }
                char* end = nullptr;
                const std::string& value = args[++i];
                y_max = std::strtod(value.c_str(), &end);
                FG_CHECK(end && *end == '\0' && y_max > 0, "cli", "--y-max needs a number > 0, got '", value, "'");
                continue;
            }
            const std::size_t eq = args[i].find('=');
            FG_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < args[i].size(), "cli",
                     "plot takes LABEL=METRICS.jsonl, got '", args[i], "'");
            runs.push_back({args[i].substr(0, eq), args[i].substr(eq + 1)});
        }
        FG_CHECK(!runs.empty(), "cli", "plot needs at least one LABEL=METRICS.jsonl");
        fg::write_loss_curves(runs, args[1], title, y_max);
        return 0;
    }
    if (command == "demo") {
        fg::DemoOptions opt;
        opt.device = parse_device("auto");
        for (std::size_t i = 1; i < args.size(); ++i) {
            FG_CHECK(i + 1 < args.size(), "cli", args[i], " needs a value");
            const std::string& flag = args[i];
            const std::string& value = args[++i];
            if (flag == "--device") opt.device = parse_device(value);
            else if (flag == "--steps") opt.steps = static_cast<int>(parse_int(flag, value, 1, 10000000));
            else if (flag == "--seed") opt.seed = static_cast<std::uint64_t>(parse_int(flag, value, 0));
            else fg::fail("cli", "unknown option '", flag, "' for demo");
        }
        fg::run_demo(opt);
        return 0;
    }
    fg::fail("cli", "unknown command '", command, "' (try fusegrad --help)");
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(std::vector<std::string>(argv + 1, argv + argc));
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of host memory (std::bad_alloc): reduce "
                             "train.batch_size, model.block_size or the model's size\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
