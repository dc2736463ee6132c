// train/main.cpp: the `fusegrad` command. The only place that catches exceptions: it prints
// "error: ..." and exits non-zero. Subcommands: train, sample, eval, plot, demo, info, norm-plan.
#include <cerrno>
#include <cmath>
#include <csignal>
#include <new>
#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "core/cuda_backend.h"
#include "core/error.h"
#include "demo.h"
#include "kernels/norm/explain.h"
#include "plot.h"
#include "trainer.h"

namespace {

bool g_progress_bar = false;  // the trainer draws one (train, on a terminal)

const char* kUsage =
    "usage: fusegrad <command> [options]\n"
    "\n"
    "commands:\n"
    "  train CONFIG.yaml [--set key.path=value]... [--max-steps N]\n"
    "  train --resume RUN_DIR [--set key.path=value]... [--max-steps N]\n"
    "        train a GPT from a YAML config (Ctrl-C saves a checkpoint and stops; --max-steps\n"
    "        stops after step N with the schedule unchanged, and --resume goes on from there)\n"
    "        --ranks N: N processes on this host, each a share of every batch (data parallel,\n"
    "        README 'Several processes'); a rank that fails stops the others\n"
    "  demo [--device auto|cpu|cuda] [--steps N] [--seed S]\n"
    "        train a small MLP with fusegrad's autograd (a tour of the core)\n"
    "  sample RUN_DIR [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K]\n"
    "         [--seed S] [--best] [--device auto|cpu|cuda]\n"
    "        continue a prompt with a trained model (temperature 0: greedy)\n"
    "  eval RUN_DIR [--best] [--device auto|cpu|cuda]\n"
    "        train and validation loss (and held-out accuracy for addition)\n"
    "  plot OUT.svg LABEL=METRICS.jsonl... [--title TEXT] [--y-max LOSS]\n"
    "        train and validation loss of one or more runs on the same axes\n"
    "  info  print the build and the devices fusegrad can use\n"
    "  norm-plan --cols N [--rows M] [--norm rms|layer] [--dtype bf16|f16|f32]\n"
    "            [--weights f32|input] [--weight|--bias|--residual|--dh|--zero-centered|\n"
    "            --misaligned yes|no] [--reduction auto|grid|locked] [--gpu h100|h200|a100]\n"
    "        which fused norm kernels a call of that shape runs, and why (the rule ids of\n"
    "        docs/norms.md's tuning rules); needs no GPU\n";

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

// A TCP port nothing listens on now (the kernel's pick), for the ranks' rendezvous.
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    FG_CHECK(fd >= 0, "cli", "--ranks: socket() failed");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::close(fd);
    FG_CHECK(ok, "cli", "--ranks: no free TCP port for the ranks to meet on");
    return ntohs(a.sin_port);
}

volatile std::sig_atomic_t g_launcher_signal = 0;

// `fusegrad train ... --ranks N`: this process starts N copies of itself with `args` (the
// command line without --ranks), each told its rank as torchrun would tell it (WORLD_SIZE, RANK,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and waits for them. Ctrl-C or SIGTERM is passed on
// (the ranks agree to stop after the same step, and rank 0 saves it). When a rank fails, the
// others are stopped too (they would stop by themselves as soon as they next exchange
// gradients; this also ends one that hangs): SIGTERM, then SIGKILL 10 s later.
int launch_ranks(long ranks, const std::vector<std::string>& args) {
    const int port = free_port();
    // The job token the ranks prove they belong to this job with (train/distributed.h): random,
    // unless the caller set one.
    std::random_device entropy;  // /dev/urandom
    char token[33];
    std::snprintf(token, sizeof token, "%08x%08x%08x%08x", entropy(), entropy(), entropy(),
                  entropy());
    const pid_t launcher = ::getpid();
    std::vector<pid_t> children;
    for (long r = 0; r < ranks; ++r) {
        const pid_t pid = ::fork();
        FG_CHECK(pid >= 0, "cli", "--ranks: could not start rank ", r);
        if (pid == 0) {
            // The launcher's death (even kill -9) sends this rank SIGTERM: it stops as Ctrl-C
            // would stop it, instead of training on as an orphan. If the launcher died before
            // this line, nobody would send it: check.
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != launcher) ::_exit(143);
            ::setenv("FUSEGRAD_JOB_TOKEN", token, 0);
            ::setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
            ::setenv("RANK", std::to_string(r).c_str(), 1);
            ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
            ::setenv("MASTER_ADDR", "127.0.0.1", 1);
            ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
            ::setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast on shared machines
            std::vector<char*> argv;
            static const std::string self = "fusegrad";
            argv.push_back(const_cast<char*>(self.c_str()));
            for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
            argv.push_back(nullptr);
            ::execv("/proc/self/exe", argv.data());
            std::perror("fusegrad --ranks: exec");
            ::_exit(127);
        }
        children.push_back(pid);
    }
    std::signal(SIGINT, [](int s) { g_launcher_signal = s; });
    std::signal(SIGTERM, [](int s) { g_launcher_signal = s; });
    int status = 0;
    bool stopping = false;
    std::chrono::steady_clock::time_point kill_at{};
    std::size_t running = children.size();
    while (running > 0) {
        if (g_launcher_signal != 0) {
            for (pid_t pid : children)
                if (pid > 0) ::kill(pid, g_launcher_signal);
            g_launcher_signal = 0;
        }
        int st = 0;
        const pid_t done = ::waitpid(-1, &st, WNOHANG);
        if (done > 0) {
            for (pid_t& pid : children)
                if (pid == done) pid = -1;
            --running;
            const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (code != 0 && code != 130 && status == 0) {
                status = code;
                if (!stopping && running > 0) {
                    std::fprintf(stderr, "fusegrad --ranks: a rank failed (exit %d): stopping "
                                 "the others\n", code);
                    for (pid_t pid : children)
                        if (pid > 0) ::kill(pid, SIGTERM);
                    stopping = true;
                    kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                }
            } else if (code == 130 && status == 0) {
                status = 130;
            }
            continue;
        }
        if (stopping && std::chrono::steady_clock::now() > kill_at)
            for (pid_t pid : children)
                if (pid > 0) ::kill(pid, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return status;
}

// `fusegrad norm-plan`: kernels/norm/explain.h's account of one call's plan.
int norm_plan_command(const std::vector<std::string>& args) {
    namespace np = fg::kernels::norm_plan;
    np::NormCall call;
    call.rows = 16384;
    call.elem_bytes = 2;
    call.weight = true;
    call.partials = true;
    call.reduction = fg::kernels::NormReduction::automatic;
    std::string gpu = "h100", bias = "", weights = "f32", dtype = "bf16";
    bool misaligned = false;
    auto yes_no = [](const std::string& flag, const std::string& value) {
        FG_CHECK(value == "yes" || value == "no", "norm-plan", flag, " wants yes or no, got '",
                 value, "'");
        return value == "yes";
    };
    for (std::size_t i = 1; i < args.size(); ++i) {
        const std::string& flag = args[i];
        FG_CHECK(i + 1 < args.size(), "norm-plan", flag, " needs a value");
        const std::string& value = args[++i];
        if (flag == "--cols") call.cols = parse_int(flag, value, 1, 1L << 30);
        else if (flag == "--rows") call.rows = parse_int(flag, value, 1, 1L << 40);
        else if (flag == "--gpu") gpu = value;
        else if (flag == "--bias") bias = value;
        else if (flag == "--weight") call.weight = yes_no(flag, value);
        else if (flag == "--residual") call.residual = yes_no(flag, value);
        else if (flag == "--dh") call.dh = yes_no(flag, value);
        else if (flag == "--zero-centered") call.zero_centered = yes_no(flag, value);
        else if (flag == "--misaligned") misaligned = yes_no(flag, value);
        else if (flag == "--norm") {
            FG_CHECK(value == "rms" || value == "layer", "norm-plan",
                     "--norm wants rms or layer, got '", value, "'");
            call.kind = value == "rms" ? fg::kernels::NormKind::rms : fg::kernels::NormKind::layer;
        } else if (flag == "--dtype") {
            FG_CHECK(value == "bf16" || value == "f16" || value == "f32", "norm-plan",
                     "--dtype wants bf16, f16 or f32, got '", value, "'");
            call.elem_bytes = value == "f32" ? 4 : 2;
            dtype = value;
        } else if (flag == "--weights") {
            FG_CHECK(value == "f32" || value == "input", "norm-plan",
                     "--weights wants f32 or input, got '", value, "'");
            weights = value;
        } else if (flag == "--reduction") {
            FG_CHECK(value == "auto" || value == "grid" || value == "locked", "norm-plan",
                     "--reduction wants auto, grid or locked, got '", value, "'");
            call.reduction = value == "grid"     ? fg::kernels::NormReduction::grid
                             : value == "locked" ? fg::kernels::NormReduction::locked
                                                 : fg::kernels::NormReduction::automatic;
        } else {
            fg::fail("norm-plan", "unknown option '", flag, "' (try fusegrad --help)");
        }
    }
    FG_CHECK(call.cols > 0, "norm-plan", "--cols N is needed: the length of a row");
    // LayerNorm modules have a bias and RMSNorm ones do not, unless told otherwise.
    call.bias = bias.empty() ? call.kind == fg::kernels::NormKind::layer : yes_no("--bias", bias);
    call.weight_bytes = weights == "f32" ? 4 : call.elem_bytes;
    call.vector_ok = !misaligned && call.cols % (16 / call.elem_bytes) == 0;
    np::NormDevice device;
    try {
        device = np::norm_device_named(gpu);
    } catch (const std::invalid_argument& e) {
        fg::fail("norm-plan", "--gpu: ", e.what());
    }
    std::printf("%s %s, %lld x %lld, weights %s%s%s%s%s, %s 16-byte vectors, on %s:\n",
                call.kind == fg::kernels::NormKind::rms ? "rmsnorm" : "layernorm",
                dtype.c_str(), call.rows, call.cols, call.weight_bytes == 4 ? "f32" : dtype.c_str(), call.weight ? "" : ", no weight",
                call.bias ? ", bias" : "", call.residual ? ", fused residual" : "",
                call.dh ? ", dh" : "", call.vector_ok ? "with" : "without", gpu.c_str());
    std::fputs(np::explain_plan(call, device, fg::kernels::NormTuning{}).c_str(), stdout);
    return 0;
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
            fg::CudaBackend& cuda = fg::cuda_backend("info");
            const std::string no_nccl = cuda.nccl_unavailable();
            std::printf("NCCL (several GPUs): %s\n",
                        no_nccl.empty() ? cuda.nccl_version().c_str() : no_nccl.c_str());
        } else {
            std::printf("cuda device: none\n");
        }
        return 0;
    }
    if (command == "train") {
        std::string config, resume;
        std::vector<std::string> overrides, rank_args{"train"};
        long max_steps = -1;  // stop early; the schedule still spans train.steps
        long ranks = 0;       // --ranks N: launch N ranks of this command
        for (std::size_t i = 1; i < args.size(); ++i) {
            if (args[i] == "--ranks") {
                FG_CHECK(i + 1 < args.size(), "cli", args[i], " needs a value");
                ranks = parse_int(args[i], args[i + 1], 1, 1024);
                ++i;
                continue;
            }
            rank_args.push_back(args[i]);
            if (args[i] == "--set" || args[i] == "--resume") {
                FG_CHECK(i + 1 < args.size(), "cli", args[i], " needs a value");
                (args[i] == "--set" ? overrides.emplace_back() : resume) = args[i + 1];
                rank_args.push_back(args[i + 1]);
                ++i;
            } else if (args[i] == "--max-steps") {
                FG_CHECK(i + 1 < args.size(), "cli", args[i], " needs a value");
                max_steps = parse_int(args[i], args[i + 1], 1);
                rank_args.push_back(args[i + 1]);
                ++i;
            } else if (config.empty() && args[i].rfind("--", 0) != 0) {
                config = args[i];
            } else {
                fg::fail("cli", "unexpected argument '", args[i], "' for train");
            }
        }
        FG_CHECK(config.empty() != resume.empty(), "cli",
                 "train takes a config file or --resume RUN_DIR (one of them)");
        if (ranks > 0) {
            FG_CHECK(std::getenv("WORLD_SIZE") == nullptr, "cli", "--ranks starts its own ranks, "
                     "but WORLD_SIZE is already set (this process is a rank of another launch)");
            return launch_ranks(ranks, rank_args);
        }
        // Ctrl-C, and the SIGTERM a scheduler sends before it kills: finish the step, save, exit.
        std::signal(SIGINT, [](int) { fg::Trainer::request_stop(); });
        std::signal(SIGTERM, [](int) { fg::Trainer::request_stop(); });
        std::unique_ptr<fg::Trainer> trainer;
        if (resume.empty())
            trainer = std::make_unique<fg::Trainer>(fg::load_config(config, overrides), std::cout);
        else
            trainer = fg::Trainer::resume(resume, overrides, std::cout);
        g_progress_bar = isatty(STDOUT_FILENO) == 1;
        trainer->set_progress_bar(g_progress_bar);
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
            // eval reads no prompt and samples nothing: sample's options are mistakes there.
            FG_CHECK(command == "sample" || flag == "--device", "cli", "unknown option '", flag,
                     "' for eval (eval takes --best and --device; ", flag, " is sample's)");
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
                FG_CHECK(end && *end == '\0' && y_max > 0 && std::isfinite(y_max), "cli", "--y-max needs a number > 0, got '", value, "'");
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
    if (command == "norm-plan") return norm_plan_command(args);
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

// On a terminal the progress bar may be the line the cursor is on: erase it first, so that an
// error is a line of its own, not the bar's tail.
static void end_progress_line() {
    std::cout.flush();
    if (g_progress_bar) {
        std::fputs("\r\x1b[K", stdout);
        std::fflush(stdout);
    }
}

int main(int argc, char** argv) {
    try {
        return run(std::vector<std::string>(argv + 1, argv + argc));
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
