// scale/distributed.cpp: see distributed.h.
#include "distributed.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "kernels/half.h"

namespace fg {
namespace {

using Clock = std::chrono::steady_clock;

// A whole non-negative number, or nullopt-like -1 when `text` is not one.
long long parse_count(const char* text) {
    if (text == nullptr || *text == '\0') return -1;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0) return -1;
    return v;
}

// The first of `names` that is set, and which one it was.
const char* first_set(const std::function<const char*(const char*)>& lookup,
                      std::initializer_list<const char*> names, const char** which) {
    for (const char* name : names) {
        const char* v = lookup(name);
        if (v != nullptr && *v != '\0') {
            *which = name;
            return v;
        }
    }
    *which = *names.begin();
    return nullptr;
}

int number(const std::function<const char*(const char*)>& lookup,
           std::initializer_list<const char*> names, long long low, long long high, int fallback,
           bool required) {
    const char* which = nullptr;
    const char* text = first_set(lookup, names, &which);
    if (text == nullptr) {
        FG_CHECK(!required, "distributed", which, " is not set (WORLD_SIZE is: every rank needs ",
                 "its ", which, "; torchrun and Slurm set it)");
        return fallback;
    }
    const long long v = parse_count(text);
    FG_CHECK(v >= low && v <= high, "distributed", which, " is '", text, "': expected a whole ",
             "number from ", low, " to ", high);
    return static_cast<int>(v);
}

// The socket error of the last call, as text.
std::string last_error() { return std::strerror(errno); }

constexpr std::uint32_t kMagic = 0x46475256;  // "FGRV"

struct Hello {
    std::uint32_t magic;
    std::int32_t rank;
    std::int32_t world_size;
    char token[kJobTokenMax];  // the job token, zero-padded
};

bool (*g_wait_interrupt)() = nullptr;

// Thrown out of a wait when g_wait_interrupt says so.
[[noreturn]] void interrupted_wait() {
    fail("distributed", "stopped (SIGTERM or Ctrl-C) while waiting for the other ranks");
}

// A message length read from another rank. The only messages whose length a peer announces are
// a resolved config (kilobytes), NCCL's id (128 bytes) and a few words a rank: the sums'
// lengths are each rank's own. More than kMaxAnnouncedBytes means the ranks are out of step (one
// is in another exchange than this one) or the peer is not fusegrad: never a size to allocate.
constexpr std::uint64_t kMaxAnnouncedBytes = std::uint64_t{16} << 20;
void check_length(std::uint64_t n, const char* what) {
    FG_CHECK(n <= kMaxAnnouncedBytes, "distributed", what, " announced ", n,
             " bytes, more than the ", kMaxAnnouncedBytes, " any such message can need: the ranks "
             "are out of step (each rank must make the same exchanges)");
}

double seconds_left(Clock::time_point deadline) {
    return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Waits until `fd` is readable (or writable), at most until `deadline`; false on timeout. A stop
// request (set_wait_interrupt) ends the wait within 200 ms with an error.
bool wait_for(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        if (g_wait_interrupt && g_wait_interrupt()) interrupted_wait();
        const double left = seconds_left(deadline);
        if (left <= 0) return false;
        pollfd p{fd, events, 0};
        const int r = ::poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 200.0)) + 1);
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return true;  // let the next call report the error
    }
}

// Reads exactly n bytes before `deadline`; false on a timeout, an error or a closed connection
// (the rendezvous drops such a connection instead of failing).
bool try_recv(int fd, void* data, std::size_t n, Clock::time_point deadline) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        if (!wait_for(fd, POLLIN, deadline)) return false;
        const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (got <= 0) return false;
        p += got;
        n -= static_cast<std::size_t>(got);
    }
    return true;
}

// "1.2.3.4:5678" of a connected socket's peer.
std::string peer_name(int fd) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "an unknown peer";
    char ip[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

// The job token as a hello carries it.
void fill_token(char (&out)[kJobTokenMax], const std::string& token) {
    std::memset(out, 0, sizeof out);
    std::memcpy(out, token.data(), std::min(token.size(), sizeof out));
}

}  // namespace

DistributedEnv distributed_env(const std::function<const char*(const char*)>& lookup) {
    DistributedEnv env;
    const char* which = nullptr;
    const bool any = first_set(lookup, {"WORLD_SIZE", "SLURM_NTASKS"}, &which) != nullptr;
    if (!any) return env;
    env.world_size = number(lookup, {"WORLD_SIZE", "SLURM_NTASKS"}, 1, 1 << 20, 1, true);
    env.rank = number(lookup, {"RANK", "SLURM_PROCID"}, 0, 1 << 20, 0, true);
    FG_CHECK(env.rank < env.world_size, "distributed", "RANK is ", env.rank,
             ", but WORLD_SIZE is ", env.world_size, ": ranks run from 0 to ", env.world_size - 1);
    // Without LOCAL_RANK, one host: the GPU is the rank.
    env.local_rank = number(lookup, {"LOCAL_RANK", "SLURM_LOCALID"}, 0, 1 << 20, env.rank, false);
    const char* addr = lookup("MASTER_ADDR");
    if (addr != nullptr && *addr != '\0') env.master_addr = addr;
    env.master_port = number(lookup, {"MASTER_PORT"}, 1, 65535, env.master_port, false);
    const char* token = lookup("FUSEGRAD_JOB_TOKEN");
    const char* torchrun = lookup("TORCHELASTIC_RUN_ID");
    const char* slurm = lookup("SLURM_JOB_ID");
    if (token != nullptr && *token != '\0') env.job_token = token;
    else if (torchrun != nullptr && *torchrun != '\0') env.job_token = std::string("torchrun:") + torchrun;
    else if (slurm != nullptr && *slurm != '\0') env.job_token = std::string("slurm:") + slurm;
    FG_CHECK(env.job_token.size() <= kJobTokenMax, "distributed", "FUSEGRAD_JOB_TOKEN (or the job "
             "id) has ", env.job_token.size(), " characters; at most ", kJobTokenMax, " are used");
    return env;
}

void set_wait_interrupt(bool (*interrupted)()) { g_wait_interrupt = interrupted; }

TcpGroup::TcpGroup(const DistributedEnv& env, double timeout_s) : env_(env), timeout_s_(timeout_s) {
    if (!env.distributed()) return;
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeout_s));
    const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
    if (env.rank == 0) {
        listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        FG_CHECK(listen_fd_ >= 0, "distributed", "rank 0: socket() failed: ", last_error());
        const int one = 1;
        ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        // MASTER_ADDR's address only (127.0.0.1 for --ranks): the other ranks connect there, and
        // nothing on another interface can reach the rendezvous (but see below).
        addrinfo want{};
        want.ai_family = AF_INET;
        want.ai_socktype = SOCK_STREAM;
        addrinfo* own = nullptr;
        const int gai = ::getaddrinfo(env.master_addr.c_str(), nullptr, &want, &own);
        FG_CHECK(gai == 0 && own != nullptr, "distributed", "MASTER_ADDR '", env.master_addr,
                 "' does not resolve: ", ::gai_strerror(gai));
        sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(own->ai_addr);
        ::freeaddrinfo(own);
        a.sin_port = htons(static_cast<std::uint16_t>(env.master_port));
        // Two cases where the other ranks reach rank 0 at an address this host cannot bind as
        // MASTER_ADDR resolves here: a host name that resolves to loopback on its own host (Debian
        // maps it to 127.0.1.1) but not elsewhere, and an address outside this host (NAT, a
        // service address). Then every interface, said on stderr; the job token still applies.
        const bool loopback = (ntohl(a.sin_addr.s_addr) >> 24) == 127;
        const bool loopback_name = env.master_addr == "localhost" ||
                                   env.master_addr.rfind("127.", 0) == 0;
        auto every_interface = [&](const char* why) {
            std::fprintf(stderr, "fusegrad: rank 0 listens on every interface, port %d: %s\n",
                         env.master_port, why);
            a.sin_addr.s_addr = htonl(INADDR_ANY);
        };
        if (loopback && !loopback_name)
            every_interface("MASTER_ADDR names this host, which resolves to a loopback address "
                            "here (other hosts cannot reach that)");
        bool bound = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        if (!bound && errno == EADDRNOTAVAIL && a.sin_addr.s_addr != htonl(INADDR_ANY)) {
            every_interface("MASTER_ADDR's address is not one of this host's (NAT or a service "
                            "address?)");
            bound = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        }
        FG_CHECK(bound,
                 "distributed", "rank 0 cannot listen on ", where, " (", last_error(),
                 "): another run on that port, or MASTER_ADDR not an address of this host? set "
                 "MASTER_PORT to a free port");
        FG_CHECK(::listen(listen_fd_, env.world_size) == 0, "distributed", "rank 0: listen() on ",
                 "port ", env.master_port, " failed: ", last_error());
        peers_.assign(static_cast<std::size_t>(env.world_size - 1), -1);
        char token[kJobTokenMax];
        fill_token(token, env.job_token);
        auto missing = [&] {
            std::string m;
            for (int r = 1; r < env.world_size; ++r)
                if (peers_[static_cast<std::size_t>(r - 1)] < 0)
                    m += (m.empty() ? "" : ", ") + std::to_string(r);
            return m;
        };
        // A connection that is not a rank of this job is dropped and reported, never fatal.
        auto drop = [&](int fd, const std::string& why) {
            std::fprintf(stderr, "fusegrad: rank 0 dropped a connection from %s to %s: %s\n",
                         peer_name(fd).c_str(), where.c_str(), why.c_str());
            ::close(fd);
        };
        // Connections whose hello is still coming, read side by side (poll), so that a silent
        // client holds up no rank behind it; each has 5 s for its hello.
        struct Pending {
            int fd;
            Clock::time_point by;
            std::size_t got;
            Hello hello;
        };
        std::vector<Pending> pending;
        // A whole hello: take the rank, or drop the connection saying why.
        auto settle = [&](const Pending& c) {
            const Hello& hello = c.hello;
            if (hello.magic != kMagic) return drop(c.fd, "not a fusegrad rank's hello");
            if (std::memcmp(hello.token, token, sizeof token) != 0)
                return drop(c.fd, "a hello with another job token (FUSEGRAD_JOB_TOKEN): not a "
                                  "rank of this job");
            if (hello.world_size != env.world_size || hello.rank < 1 ||
                hello.rank >= env.world_size || peers_[static_cast<std::size_t>(hello.rank - 1)] >= 0)
                return drop(c.fd, "it says it is rank " + std::to_string(hello.rank) + " of " +
                                      std::to_string(hello.world_size) + ", which this job (" +
                                      std::to_string(env.world_size) + " ranks, waiting for " +
                                      missing() + ") has no place for");
            // At once, so a rank can tell a fusegrad rank 0 from whatever else answers the port.
            if (::send(c.fd, &kMagic, sizeof kMagic, MSG_NOSIGNAL) != sizeof kMagic)
                return drop(c.fd, "it closed the connection after its hello");
            peers_[static_cast<std::size_t>(hello.rank - 1)] = c.fd;
        };
        auto arrived = [&] {
            return std::count_if(peers_.begin(), peers_.end(), [](int fd) { return fd >= 0; });
        };
        Clock::time_point next_report = Clock::now() + std::chrono::seconds(10);
        while (arrived() < env.world_size - 1) {
            if (g_wait_interrupt && g_wait_interrupt()) {
                for (const Pending& c : pending) ::close(c.fd);
                interrupted_wait();
            }
            const Clock::time_point now = Clock::now();
            if (now >= deadline) {
                for (const Pending& c : pending) ::close(c.fd);
                fail("distributed", "rank 0 waited ", timeout_s, " s on ", where, " for ranks ",
                     missing(), " of ", env.world_size,
                     ", which did not connect: did they start, with MASTER_ADDR and MASTER_PORT "
                     "pointing here?");
            }
            if (now >= next_report) {
                std::fprintf(stderr, "fusegrad: rank 0 waits on %s for ranks %s of %d (%.0f s "
                             "left)\n", where.c_str(), missing().c_str(), env.world_size,
                             seconds_left(deadline));
                next_report = now + std::chrono::seconds(10);
            }
            std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
            for (const Pending& c : pending) fds.push_back({c.fd, POLLIN, 0});
            if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR)
                fail("distributed", "rank 0: poll() failed: ", last_error());
            std::vector<Pending> still;
            for (std::size_t k = 0; k < pending.size(); ++k) {
                Pending c = pending[k];
                if (fds[k + 1].revents != 0) {
                    const ssize_t n = ::recv(c.fd, reinterpret_cast<char*>(&c.hello) + c.got,
                                             sizeof c.hello - c.got, MSG_DONTWAIT);
                    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
                        drop(c.fd, "no whole hello: it closed the connection (not a fusegrad rank)");
                        continue;
                    }
                    if (n > 0) c.got += static_cast<std::size_t>(n);
                }
                if (c.got == sizeof c.hello) settle(c);
                else if (Clock::now() >= c.by)
                    drop(c.fd, "no whole hello: silent for 5 s (not a fusegrad rank)");
                else still.push_back(c);
            }
            pending.swap(still);
            if (fds[0].revents & POLLIN) {
                const int fd = ::accept(listen_fd_, nullptr, nullptr);
                if (fd >= 0) pending.push_back({fd, Clock::now() + std::chrono::seconds(5), 0, {}});
            }
        }
        for (const Pending& c : pending) drop(c.fd, "every rank had come");
        for (int fd : peers_) send_all(fd, &kMagic, sizeof kMagic, "the welcome");
        return;
    }
    // Other ranks: connect to rank 0, retrying while it is not listening yet.
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int gai = ::getaddrinfo(env.master_addr.c_str(),
                                  std::to_string(env.master_port).c_str(), &hints, &found);
    FG_CHECK(gai == 0 && found != nullptr, "distributed", "MASTER_ADDR '", env.master_addr,
             "' does not resolve: ", ::gai_strerror(gai));
    int fd = -1;
    std::string why;
    while (fd < 0) {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) break;
        why = last_error();
        if (fd >= 0) ::close(fd);
        fd = -1;
        if (g_wait_interrupt && g_wait_interrupt()) {
            ::freeaddrinfo(found);
            interrupted_wait();
        }
        if (seconds_left(deadline) <= 0) {
            ::freeaddrinfo(found);
            fail("distributed", "rank ", env.rank, " could not reach rank 0 at ", where, " in ",
                 timeout_s, " s (", why, "): is rank 0 running, and MASTER_ADDR right?");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::freeaddrinfo(found);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    peers_.push_back(fd);
    Hello hello{kMagic, env.rank, env.world_size, {}};
    fill_token(hello.token, env.job_token);
    send_all(fd, &hello, sizeof hello, "the hello");
    // Rank 0 answers the hello at once; then, once every rank has come, welcomes them all.
    std::uint32_t ack = 0;
    FG_CHECK(try_recv(fd, &ack, sizeof ack, std::min(deadline, Clock::now() + std::chrono::seconds(5))) &&
                 ack == kMagic,
             "distributed", "rank ", env.rank, ": what answered at ", where,
             " is not a fusegrad rank 0 of this job (no answer to the hello within 5 s; a job "
             "token that differs, FUSEGRAD_JOB_TOKEN, is dropped the same way)");
    std::uint32_t welcome = 0;
    recv_all(fd, &welcome, sizeof welcome, "rank 0's welcome");
    FG_CHECK(welcome == kMagic, "distributed", "rank ", env.rank, ": what answered at ", where,
             " is not a fusegrad rank 0");
}

TcpGroup::~TcpGroup() {
    for (int fd : peers_)
        if (fd >= 0) ::close(fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpGroup::send_all(int fd, const void* data, std::size_t n, const char* what) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeout_s_));
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        // A rank that hangs without reading fills the connection; bounded like a receive.
        FG_CHECK(wait_for(fd, POLLOUT, deadline), "distributed", "rank ", env_.rank, " waited ",
                 timeout_s_, " s to send ", what, ", which nobody read (did another rank hang?)");
        // Without blocking: a send blocks until all of a large buffer is read otherwise.
        const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        FG_CHECK(sent > 0, "distributed", "rank ", env_.rank, " could not send ", what, ": ",
                 sent < 0 ? last_error() : std::string("connection closed"),
                 " (did another rank stop?)");
        p += sent;
        n -= static_cast<std::size_t>(sent);
    }
}

void TcpGroup::recv_all(int fd, void* data, std::size_t n, const char* what) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeout_s_));
    char* p = static_cast<char*>(data);
    while (n > 0) {
        FG_CHECK(wait_for(fd, POLLIN, deadline), "distributed", "rank ", env_.rank, " waited ",
                 timeout_s_, " s for ", what, ", which did not come");
        const ssize_t got = ::recv(fd, p, n, 0);
        if (got < 0 && errno == EINTR) continue;
        FG_CHECK(got > 0, "distributed", "rank ", env_.rank, " lost the connection while ",
                 "waiting for ", what, ": ", got < 0 ? last_error() : std::string("closed"),
                 " (did another rank stop?)");
        p += got;
        n -= static_cast<std::size_t>(got);
    }
}

std::vector<std::uint8_t> TcpGroup::broadcast(const std::vector<std::uint8_t>& bytes) {
    if (!env_.distributed()) return bytes;
    if (env_.rank == 0) {
        const std::uint64_t n = bytes.size();
        for (int fd : peers_) {
            send_all(fd, &n, sizeof n, "a broadcast's length");
            send_all(fd, bytes.data(), bytes.size(), "a broadcast");
        }
        return bytes;
    }
    std::uint64_t n = 0;
    recv_all(peers_[0], &n, sizeof n, "rank 0's broadcast");
    check_length(n, "rank 0's broadcast");
    std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
    recv_all(peers_[0], out.data(), out.size(), "rank 0's broadcast");
    return out;
}

void TcpGroup::barrier() {
    if (!env_.distributed()) return;
    std::uint8_t token = 1;
    if (env_.rank == 0) {
        for (int fd : peers_) recv_all(fd, &token, 1, "the other ranks at a barrier");
        for (int fd : peers_) send_all(fd, &token, 1, "the barrier's release");
        return;
    }
    send_all(peers_[0], &token, 1, "its arrival at a barrier");
    recv_all(peers_[0], &token, 1, "rank 0's release of a barrier");
}

template <typename T>
void TcpGroup::sum_in_rank_order(T* values, std::size_t n) {
    if (!env_.distributed() || n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    if (env_.rank == 0) {
        std::vector<T> theirs(n);
        for (int fd : peers_) {  // peers_ is in rank order: rank 1, 2, ...
            recv_all(fd, theirs.data(), bytes, "a rank's values to sum");
            for (std::size_t i = 0; i < n; ++i) values[i] += theirs[i];
        }
        for (int fd : peers_) send_all(fd, values, bytes, "the sums");
        return;
    }
    send_all(peers_[0], values, bytes, "its values to sum");
    recv_all(peers_[0], values, bytes, "rank 0's sums");
}

void TcpGroup::all_reduce_sum(float* values, std::size_t n) { sum_in_rank_order(values, n); }
void TcpGroup::all_reduce_sum(double* values, std::size_t n) { sum_in_rank_order(values, n); }

template <typename Wire, typename Sum, typename Widen, typename Narrow>
void TcpGroup::sum_and_scatter(const Wire* in, Wire* out, std::size_t n, bool whole, Widen widen,
                               Narrow narrow) {
    const std::size_t ranks = static_cast<std::size_t>(env_.world_size);
    const std::size_t total = whole ? n : ranks * n;  // values each rank sends
    if (!env_.distributed() || n == 0) {
        if (n > 0 && out != in) std::memmove(out, in, n * sizeof(Wire));
        return;
    }
    if (env_.rank == 0) {  // the sums in rank order, as sum_in_rank_order adds them
        std::vector<Sum> sums(total);
        for (std::size_t i = 0; i < total; ++i) sums[i] = widen(in[i]);
        std::vector<Wire> theirs(total);
        for (int fd : peers_) {
            recv_all(fd, theirs.data(), total * sizeof(Wire), "a rank's values to sum");
            for (std::size_t i = 0; i < total; ++i) sums[i] += widen(theirs[i]);
        }
        std::vector<Wire> rounded(total);
        for (std::size_t i = 0; i < total; ++i) rounded[i] = narrow(sums[i]);
        for (std::size_t r = 1; r < ranks; ++r)
            send_all(peers_[r - 1], rounded.data() + (whole ? 0 : r * n), n * sizeof(Wire),
                     "a rank's sums");
        std::memcpy(out, rounded.data(), n * sizeof(Wire));
        return;
    }
    send_all(peers_[0], in, total * sizeof(Wire), "its values to sum");
    recv_all(peers_[0], out, n * sizeof(Wire), "rank 0's sums");
}

void TcpGroup::reduce_scatter_sum(const float* in, float* out, std::size_t n) {
    const auto same = [](float v) { return v; };
    sum_and_scatter<float, float>(in, out, n, false, same, same);
}

void TcpGroup::all_reduce_sum_bf16(std::uint16_t* values, std::size_t n) {
    sum_and_scatter<std::uint16_t, float>(values, values, n, true, half::bf16_to_float,
                                          half::float_to_bf16);
}

void TcpGroup::reduce_scatter_sum_bf16(const std::uint16_t* in, std::uint16_t* out,
                                       std::size_t n) {
    sum_and_scatter<std::uint16_t, float>(in, out, n, false, half::bf16_to_float,
                                          half::float_to_bf16);
}

void TcpGroup::all_gather(const float* in, float* out, std::size_t n) {
    const std::size_t ranks = static_cast<std::size_t>(env_.world_size);
    float* mine = out + static_cast<std::size_t>(env_.rank) * n;
    if (n > 0 && in != mine) std::memmove(mine, in, n * sizeof(float));
    if (!env_.distributed() || n == 0) return;
    if (env_.rank == 0) {
        for (std::size_t r = 1; r < ranks; ++r)
            recv_all(peers_[r - 1], out + r * n, n * sizeof(float), "a rank's values to gather");
        for (int fd : peers_) send_all(fd, out, ranks * n * sizeof(float), "the gathered values");
        return;
    }
    send_all(peers_[0], mine, n * sizeof(float), "its values to gather");
    recv_all(peers_[0], out, ranks * n * sizeof(float), "rank 0's gathered values");
}

std::string TcpGroup::peers_lost() const {
    for (std::size_t i = 0; i < peers_.size(); ++i) {
        pollfd p{peers_[i], POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return "rank " + std::to_string(env_.rank == 0 ? i + 1 : 0) +
                   " closed its connection (it stopped)";
    }
    return "";
}

void TcpGroup::shutdown() noexcept {
    for (int fd : peers_)
        if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

std::vector<std::vector<std::uint8_t>> TcpGroup::all_gather(
    const std::vector<std::uint8_t>& bytes) {
    std::vector<std::vector<std::uint8_t>> all{bytes};
    if (!env_.distributed()) return all;
    std::vector<std::uint8_t> packed;  // rank 0: every rank's length and bytes, in rank order
    if (env_.rank == 0) {
        for (int fd : peers_) {
            std::uint64_t len = 0;
            recv_all(fd, &len, sizeof len, "a rank's length to gather");
            check_length(len, "a rank's gather");
            std::vector<std::uint8_t> theirs(static_cast<std::size_t>(len));
            recv_all(fd, theirs.data(), theirs.size(), "a rank's bytes to gather");
            all.push_back(std::move(theirs));
        }
        for (const auto& one : all) {
            const std::uint64_t len = one.size();
            const auto* p = reinterpret_cast<const std::uint8_t*>(&len);
            packed.insert(packed.end(), p, p + sizeof len);
            packed.insert(packed.end(), one.begin(), one.end());
        }
    } else {
        const std::uint64_t len = bytes.size();
        send_all(peers_[0], &len, sizeof len, "its length to gather");
        send_all(peers_[0], bytes.data(), bytes.size(), "its bytes to gather");
    }
    packed = broadcast(packed);
    all.clear();
    for (std::size_t at = 0; at < packed.size();) {
        std::uint64_t len = 0;
        std::memcpy(&len, packed.data() + at, sizeof len);
        at += sizeof len;
        all.emplace_back(packed.begin() + static_cast<std::ptrdiff_t>(at),
                         packed.begin() + static_cast<std::ptrdiff_t>(at + len));
        at += static_cast<std::size_t>(len);
    }
    return all;
}

Batch shard_batch(const Batch& global, int rank, int world_size) {
    const std::int64_t rows = global.inputs.size(0);
    FG_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "distributed", "rank ", rank,
             " of ", world_size, " ranks");
    FG_CHECK(rows % world_size == 0, "distributed", "train.batch_size (", rows,
             ") must be a multiple of the number of GPUs (", world_size,
             "): each rank takes an equal share of every batch");
    const std::int64_t share = rows / world_size;
    return Batch{global.inputs.slice(rank * share, (rank + 1) * share),
                 global.targets.slice(rank * share, (rank + 1) * share)};
}

std::vector<GradBucket> plan_buckets(const std::vector<std::int64_t>& numels,
                                     std::size_t bytes_per_element, std::size_t cap_bytes) {
    std::vector<GradBucket> buckets;
    for (int i = static_cast<int>(numels.size()) - 1; i >= 0; --i) {
        const std::size_t bytes =
            static_cast<std::size_t>(numels[static_cast<std::size_t>(i)]) * bytes_per_element;
        if (buckets.empty() || buckets.back().bytes + bytes > cap_bytes) buckets.emplace_back();
        buckets.back().params.push_back(i);
        buckets.back().bytes += bytes;
    }
    return buckets;
}

std::vector<BucketLayout> layout_buckets(const std::vector<GradBucket>& buckets,
                                         const std::vector<std::int64_t>& numels, int world_size) {
    FG_CHECK(world_size >= 1, "distributed", "world_size ", world_size);
    std::vector<BucketLayout> out;
    for (const GradBucket& b : buckets) {
        BucketLayout l;
        l.params = b.params;
        for (int i : b.params) {
            l.offsets.push_back(l.numel);
            l.numel += numels[static_cast<std::size_t>(i)];
        }
        l.shard = (l.numel + world_size - 1) / world_size;
        l.padded = l.shard * world_size;
        out.push_back(std::move(l));
    }
    return out;
}

std::vector<ShardPiece> shard_pieces(const BucketLayout& bucket, int rank) {
    const std::int64_t begin = static_cast<std::int64_t>(rank) * bucket.shard;
    const std::int64_t end = begin + bucket.shard;
    std::vector<ShardPiece> pieces;
    for (std::size_t k = 0; k < bucket.params.size(); ++k) {
        const std::int64_t start = bucket.offsets[k];
        const std::int64_t stop =
            k + 1 < bucket.params.size() ? bucket.offsets[k + 1] : bucket.numel;
        const std::int64_t lo = std::max(start, begin), hi = std::min(stop, end);
        if (lo < hi) pieces.push_back({bucket.params[k], lo - start, lo - begin, hi - lo});
    }
    return pieces;
}

}  // namespace fg
