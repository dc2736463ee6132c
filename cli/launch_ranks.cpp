// cli/launch_ranks.cpp: see launch_ranks.h. The ranks meet on a free port of 127.0.0.1 and prove
// they belong to this launch with a random job token (scale/distributed.h).
#include "launch_ranks.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"

namespace fg::cli {
namespace {

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

}  // namespace

// `fusegrad train ... --ranks N`: this process starts N copies of itself with `args` (the
// command line without --ranks), each told its rank as torchrun would tell it (WORLD_SIZE, RANK,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and waits for them. Ctrl-C or SIGTERM is passed on
// (the ranks agree to stop after the same step, and rank 0 saves it). When a rank fails, the
// others are stopped too (they would stop by themselves as soon as they next exchange
// gradients; this also ends one that hangs): SIGTERM, then SIGKILL 10 s later.
int launch_ranks(long ranks, const std::vector<std::string>& args) {
    const int port = free_port();
    // The job token the ranks prove they belong to this job with (scale/distributed.h): random,
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

}  // namespace fg::cli
