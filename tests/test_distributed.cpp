// tests/test_distributed.cpp: the parts of data-parallel training a CPU can check
// (scale/distributed.h, scale/grad_exchange.h): reading RANK / WORLD_SIZE / ... as torchrun and
// Slurm set them, with errors naming what is wrong; the TCP rendezvous of several ranks (threads
// here) with broadcast, barrier, sums, reduce-scatter and gather, and its timeouts; a rank's
// share of a batch; the gradient buckets' plan and ZeRO-1's slices of them; the exchange and
// ZeRO-1's AdamW over one rank against plain AdamW. Several processes: tests/distributed_cpu.sh.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <numeric>
#include <thread>

#include "kernels/half.h"
#include "scale/distributed.h"
#include "scale/grad_exchange.h"
#include "scale/scale_wing.h"
#include "train/trainer.h"
#include "test_helpers.h"

using namespace fg;

namespace {

std::function<const char*(const char*)> env_of(const std::map<std::string, std::string>& vars) {
    return [vars](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    };
}

// A TCP port nothing listens on now (the kernel's pick for port 0).
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    ::close(fd);
    return ntohs(a.sin_port);
}

DistributedEnv rank_env(int rank, int world, int port) {
    DistributedEnv e;
    e.rank = rank;
    e.world_size = world;
    e.local_rank = rank;
    e.master_port = port;
    return e;
}

}  // namespace

TEST_CASE("the distributed environment as torchrun and Slurm set it", "[distributed]") {
    DistributedEnv one = distributed_env(env_of({}));
    CHECK(one.world_size == 1);
    CHECK(one.rank == 0);
    CHECK_FALSE(one.distributed());

    DistributedEnv t = distributed_env(env_of({{"WORLD_SIZE", "4"}, {"RANK", "2"},
                                               {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"},
                                               {"MASTER_PORT", "31000"}}));
    CHECK(t.world_size == 4);
    CHECK(t.rank == 2);
    CHECK(t.local_rank == 1);
    CHECK(t.master_addr == "node7");
    CHECK(t.master_port == 31000);
    CHECK(t.distributed());

    DistributedEnv s = distributed_env(
        env_of({{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}}));
    CHECK(s.world_size == 8);
    CHECK(s.rank == 5);
    CHECK(s.local_rank == 1);
    CHECK(s.master_port == 29500);

    // Without LOCAL_RANK the rank is the GPU (one host).
    CHECK(distributed_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}})).local_rank == 1);

    // The job token: FUSEGRAD_JOB_TOKEN, else the launcher's job id, else none.
    CHECK(t.job_token.empty());
    CHECK(distributed_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"},
                                  {"FUSEGRAD_JOB_TOKEN", "abc"}, {"SLURM_JOB_ID", "7"}}))
              .job_token == "abc");
    CHECK(distributed_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"},
                                  {"TORCHELASTIC_RUN_ID", "r9"}}))
              .job_token == "torchrun:r9");
    CHECK(s.job_token.empty());
    CHECK(distributed_env(env_of({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"},
                                  {"SLURM_JOB_ID", "4711"}}))
              .job_token == "slurm:4711");
    const std::string long_token(65, 'x');
    CHECK_THROWS_WITH(distributed_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"},
                                              {"FUSEGRAD_JOB_TOKEN", long_token.c_str()}})),
                      ContainsSubstring("FUSEGRAD_JOB_TOKEN (or the job id) has 65 characters; at most 64"));

    CHECK_THROWS_WITH(distributed_env(env_of({{"WORLD_SIZE", "2"}})),
                      ContainsSubstring("[distributed] RANK is not set"));
    CHECK_THROWS_WITH(distributed_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "2"}})),
                      ContainsSubstring("RANK is 2, but WORLD_SIZE is 2: ranks run from 0 to 1"));
    CHECK_THROWS_WITH(distributed_env(env_of({{"WORLD_SIZE", "two"}, {"RANK", "0"}})),
                      ContainsSubstring("WORLD_SIZE is 'two': expected a whole number from 1"));
    CHECK_THROWS_WITH(
        distributed_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "70000"}})),
        ContainsSubstring("MASTER_PORT is '70000': expected a whole number from 1 to 65535"));
    CHECK_THROWS_WITH(distributed_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "-1"}})),
                      ContainsSubstring("RANK is '-1'"));
}

TEST_CASE("ranks meet over TCP: broadcast and barrier", "[distributed]") {
    for (int world : {2, 3}) {
        INFO("world size " << world);
        const int port = free_port();
        std::vector<std::vector<std::uint8_t>> got(static_cast<std::size_t>(world));
        std::vector<std::string> errors(static_cast<std::size_t>(world));
        std::vector<std::thread> ranks;
        for (int r = 0; r < world; ++r) {
            ranks.emplace_back([&, r] {
                try {
                    TcpGroup group(rank_env(r, world, port), 20.0);
                    const std::vector<std::uint8_t> mine =
                        r == 0 ? std::vector<std::uint8_t>{7, 1, 255, 0, 42}
                               : std::vector<std::uint8_t>{9};
                    got[static_cast<std::size_t>(r)] = group.broadcast(mine);
                    group.barrier();
                    group.barrier();
                } catch (const std::exception& e) {
                    errors[static_cast<std::size_t>(r)] = e.what();
                }
            });
        }
        for (auto& t : ranks) t.join();
        for (int r = 0; r < world; ++r) {
            INFO("rank " << r);
            CHECK(errors[static_cast<std::size_t>(r)].empty());
            CHECK(got[static_cast<std::size_t>(r)] == std::vector<std::uint8_t>{7, 1, 255, 0, 42});
        }
    }
}

TEST_CASE("a rank that never comes is an error naming it, not a hang", "[distributed]") {
    const int port = free_port();
    CHECK_THROWS_WITH(TcpGroup(rank_env(0, 3, port), 0.3),
                      ContainsSubstring("rank 0 waited 0.3 s on 127.0.0.1:" + std::to_string(port) +
                               " for ranks 1, 2 of 3"));
    CHECK_THROWS_WITH(TcpGroup(rank_env(1, 2, free_port()), 0.3),
                      ContainsSubstring("rank 1 could not reach rank 0 at 127.0.0.1:"));
    DistributedEnv bad = rank_env(1, 2, port);
    bad.master_addr = "no-such-host.invalid";
    CHECK_THROWS_WITH(TcpGroup(bad, 0.3), ContainsSubstring("MASTER_ADDR 'no-such-host.invalid' does not resolve"));
    // One process: nothing to meet.
    TcpGroup alone(DistributedEnv{}, 0.1);
    CHECK(alone.broadcast({1, 2}) == std::vector<std::uint8_t>{1, 2});
    alone.barrier();
}

TEST_CASE("each rank takes its share of a batch's rows", "[distributed]") {
    std::vector<std::int32_t> ids(6 * 4);
    std::iota(ids.begin(), ids.end(), 0);
    Batch global{Tensor::from_vector(ids, {6, 4}), Tensor::from_vector(ids, {6, 4})};
    std::vector<std::int32_t> seen;
    for (int r = 0; r < 3; ++r) {
        Batch b = shard_batch(global, r, 3);
        REQUIRE(b.inputs.shape() == Shape{2, 4});
        REQUIRE(b.targets.shape() == Shape{2, 4});
        std::vector<std::int32_t> v = b.inputs.to_vector<std::int32_t>();
        CHECK(v.front() == 8 * r);
        seen.insert(seen.end(), v.begin(), v.end());
    }
    CHECK(seen == ids);  // the shares, in rank order, are the global batch
    CHECK(shard_batch(global, 0, 1).inputs.to_vector<std::int32_t>() == ids);
    CHECK_THROWS_WITH(shard_batch(Batch{Tensor::from_vector(ids, {6, 4}),
                                        Tensor::from_vector(ids, {6, 4})}, 0, 4),
                      ContainsSubstring("train.batch_size (6) must be a multiple of the number of GPUs (4)"));
}

TEST_CASE("gradient buckets: the last parameters first, within the cap", "[distributed]") {
    // 4-byte gradients; the cap 200 bytes (50 values).
    const std::vector<std::int64_t> numels{10, 20, 30, 1000, 5, 50};
    const std::vector<GradBucket> b = plan_buckets(numels, 4, 200);
    REQUIRE(b.size() == 5);
    CHECK(b[0].params == std::vector<int>{5});     // 200 bytes: full
    CHECK(b[1].params == std::vector<int>{4});     // the next one would not fit beside it
    CHECK(b[2].params == std::vector<int>{3});     // larger than the cap: alone
    CHECK(b[3].params == std::vector<int>{2, 1});  // 120 + 80 bytes
    CHECK(b[4].params == std::vector<int>{0});
    CHECK(b[2].bytes == 4000);
    CHECK(b[3].bytes == 200);
    // Every parameter exactly once, whatever the cap.
    for (std::size_t cap : {std::size_t{1}, std::size_t{64}, std::size_t{1} << 30}) {
        std::vector<int> all;
        for (const GradBucket& g : plan_buckets(numels, 2, cap))
            all.insert(all.end(), g.params.begin(), g.params.end());
        std::sort(all.begin(), all.end());
        CHECK(all == std::vector<int>{0, 1, 2, 3, 4, 5});
    }
    CHECK(plan_buckets({}, 4, 100).empty());
    CHECK(plan_buckets(numels, 4, std::size_t{1} << 30).size() == 1);
}

TEST_CASE("ranks sum values in rank order and gather bytes", "[distributed]") {
    const int world = 3, port = free_port();
    std::vector<std::vector<float>> sums(world);
    std::vector<std::vector<double>> dsums(world);
    std::vector<std::vector<std::vector<std::uint8_t>>> gathered(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
        ranks.emplace_back([&, r] {
            try {
                TcpGroup group(rank_env(r, world, port), 20.0);
                // Values whose float sum depends on the order: 1e8 + 1 + ... loses the ones.
                std::vector<float> v{r == 0 ? 1e8f : 1.0f, static_cast<float>(r), 0.5f};
                group.all_reduce_sum(v.data(), v.size());
                sums[r] = v;
                std::vector<double> d{0.25 * r, -1.0};
                group.all_reduce_sum(d.data(), d.size());
                dsums[r] = d;
                gathered[r] = group.all_gather(std::vector<std::uint8_t>(r, static_cast<std::uint8_t>(r)));
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    }
    for (auto& t : ranks) t.join();
    const float in_rank_order = (1e8f + 1.0f) + 1.0f;  // what rank 0 computes
    for (int r = 0; r < world; ++r) {
        INFO("rank " << r);
        CHECK(errors[r].empty());
        REQUIRE(sums[r].size() == 3);
        CHECK(sums[r][0] == in_rank_order);
        CHECK(sums[r][1] == 3.0f);
        CHECK(sums[r][2] == 1.5f);
        CHECK(dsums[r] == std::vector<double>{0.75, -3.0});
        REQUIRE(gathered[r].size() == 3);
        for (int q = 0; q < world; ++q)
            CHECK(gathered[r][q] == std::vector<std::uint8_t>(q, static_cast<std::uint8_t>(q)));
    }
}

TEST_CASE("ranks reduce-scatter and all-gather floats", "[distributed]") {
    const int world = 3, port = free_port();
    const std::size_t n = 4;  // values a rank
    std::vector<std::vector<float>> slices(world), reduced(world), gathered(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> ranks;
    // Rank r's input: value i is r * 100 + i, except element 0, whose float sum depends on the
    // order (1e8 on rank 0, 1 elsewhere).
    auto input = [&](int r) {
        std::vector<float> v(world * n);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r * 100 + int(i));
        v[0] = r == 0 ? 1e8f : 1.0f;
        return v;
    };
    for (int r = 0; r < world; ++r) {
        ranks.emplace_back([&, r] {
            try {
                TcpGroup group(rank_env(r, world, port), 20.0);
                std::vector<float> in = input(r);
                slices[r].resize(n);
                group.reduce_scatter_sum(in.data(), slices[r].data(), n);
                reduced[r] = input(r);
                group.all_reduce_sum(reduced[r].data(), reduced[r].size());
                // All-gather in place: this rank's slice of the output is its input.
                gathered[r].assign(world * n, -1.0f);
                for (std::size_t i = 0; i < n; ++i) gathered[r][r * n + i] = float(r * 10 + int(i));
                group.all_gather(gathered[r].data() + r * n, gathered[r].data(), n);
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < world; ++r) {
        INFO("rank " << r);
        CHECK(errors[r].empty());
        // The slice holds the bits the all-reduce gives there (the same order of additions).
        for (std::size_t i = 0; i < n; ++i) CHECK(slices[r][i] == reduced[0][r * n + i]);
        for (int q = 0; q < world; ++q)
            for (std::size_t i = 0; i < n; ++i)
                CHECK(gathered[r][q * n + i] == float(q * 10 + int(i)));
    }
    CHECK(reduced[0][0] == (1e8f + 1.0f) + 1.0f);
    CHECK(reduced[0][5] == 3.0f * 5.0f + 300.0f);
}

TEST_CASE("ranks sum bf16 values in float, in rank order, rounded once", "[distributed]") {
    const int world = 3, port = free_port();
    const std::size_t n = 2;  // values a rank in the reduce-scatter
    std::vector<std::vector<std::uint16_t>> all(world), slices(world);
    std::vector<std::string> errors(world);
    // Even values: 1 on rank 0, 2^-8 on the others (each exact in bf16, whose 8 significant
    // bits space values near 1 by 2^-7); odd ones: 2 + r / 2.
    auto value = [](int r, std::size_t i) {
        return half::float_to_bf16(i % 2 ? 2.0f + 0.5f * float(r) : r == 0 ? 1.0f : 0x1p-8f);
    };
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
        ranks.emplace_back([&, r] {
            try {
                TcpGroup group(rank_env(r, world, port), 20.0);
                std::vector<std::uint16_t> in(world * n);
                for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
                all[r] = in;
                group.all_reduce_sum_bf16(all[r].data(), all[r].size());
                slices[r].resize(n);
                group.reduce_scatter_sum_bf16(in.data(), slices[r].data(), n);
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    }
    for (auto& t : ranks) t.join();
    for (std::size_t i = 0; i < world * n; ++i) {
        float sum = 0.0f;  // what rank 0 computes: floats in rank order, one rounding
        for (int r = 0; r < world; ++r) sum += half::bf16_to_float(value(r, i));
        for (int r = 0; r < world; ++r) {
            INFO("rank " << r << ", value " << i);
            CHECK(errors[r].empty());
            CHECK(all[r][i] == half::float_to_bf16(sum));
            if (i / n == static_cast<std::size_t>(r)) CHECK(slices[r][i % n] == all[0][i]);
        }
    }
    // 1 + 2^-8 + 2^-8 = 1 + 2^-7 in float, exact in bf16; adding in bf16 one value at a time
    // would round each 1 + 2^-8 back to 1 (a tie, to even).
    CHECK(half::bf16_to_float(all[0][0]) == 1.0f + 0x1p-7f);
    CHECK(half::bf16_to_float(all[0][1]) == 7.5f);
}

TEST_CASE("ZeRO-1's slices cover every parameter element once", "[distributed]") {
    const std::vector<std::int64_t> numels{10, 3, 7, 1, 64, 5};
    for (int world : {1, 2, 3, 4, 7}) {
        for (std::size_t cap : {std::size_t{16}, std::size_t{40}, std::size_t{1000}}) {
            INFO("world " << world << ", cap " << cap);
            const std::vector<BucketLayout> layout =
                layout_buckets(plan_buckets(numels, 4, cap), numels, world);
            std::vector<std::vector<int>> owner(numels.size());
            for (std::size_t i = 0; i < numels.size(); ++i)
                owner[i].assign(static_cast<std::size_t>(numels[i]), 0);
            for (const BucketLayout& b : layout) {
                CHECK(b.padded == b.shard * world);
                CHECK(b.padded >= b.numel);
                CHECK(b.padded - b.numel < world);
                std::int64_t in_slices = 0;
                for (int r = 0; r < world; ++r) {
                    std::int64_t at = 0;  // pieces follow one another within the slice
                    for (const ShardPiece& p : shard_pieces(b, r)) {
                        CHECK(p.shard_offset == at);
                        CHECK(p.count > 0);
                        REQUIRE(p.param_offset + p.count <=
                                numels[static_cast<std::size_t>(p.param)]);
                        for (std::int64_t e = 0; e < p.count; ++e)
                            ++owner[static_cast<std::size_t>(p.param)]
                                   [static_cast<std::size_t>(p.param_offset + e)];
                        at += p.count;
                        in_slices += p.count;
                    }
                    CHECK(at <= b.shard);
                }
                CHECK(in_slices == b.numel);
            }
            for (std::size_t i = 0; i < numels.size(); ++i)
                CHECK(std::count(owner[i].begin(), owner[i].end(), 1) == numels[i]);
        }
    }
    // Two ranks, one bucket of 10 + 3 values: 7 each, the second slice with one of padding.
    const std::vector<BucketLayout> two = layout_buckets({GradBucket{{1, 0}, 52}}, {10, 3}, 2);
    REQUIRE(two.size() == 1);
    CHECK(two[0].offsets == std::vector<std::int64_t>{0, 3});
    CHECK(two[0].shard == 7);
    const std::vector<ShardPiece> r0 = shard_pieces(two[0], 0), r1 = shard_pieces(two[0], 1);
    REQUIRE(r0.size() == 2);
    CHECK((r0[0].param == 1 && r0[0].param_offset == 0 && r0[0].count == 3));
    CHECK((r0[1].param == 0 && r0[1].param_offset == 0 && r0[1].shard_offset == 3 &&
           r0[1].count == 4));
    REQUIRE(r1.size() == 1);
    CHECK((r1[0].param == 0 && r1[0].param_offset == 4 && r1[0].shard_offset == 0 &&
           r1[0].count == 6));
}

TEST_CASE("a trainer without a wing for scale refuses to be one of several ranks", "[distributed]") {
    ::setenv("WORLD_SIZE", "2", 1);
    std::ostringstream log;
    const std::string dir = "/tmp/fg_distributed_no_wing";
    std::filesystem::remove_all(dir);
    CHECK_THROWS_WITH(Trainer(test::tiny_addition_run(dir, 2), log),
                      ContainsSubstring("[train] WORLD_SIZE is 2, but this trainer has no wing for "
                                        "scale"));
    ::unsetenv("WORLD_SIZE");
    CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE("a trainer of several ranks refuses a batch it cannot split evenly", "[distributed]") {
    // The environment a launcher would set (read by the Trainer), restored after.
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("RANK", "0", 1);
    std::ostringstream log;
    const std::string dir = "/tmp/fg_distributed_uneven";
    std::filesystem::remove_all(dir);
    CHECK_THROWS_WITH(Trainer(test::tiny_addition_run(dir, 2, {"train.batch_size=15"}), log,
                              std::make_unique<ScaleWing>()),
                      ContainsSubstring("[train] train.batch_size (15) must be a multiple of WORLD_SIZE (2)"));
    ::unsetenv("WORLD_SIZE");
    ::unsetenv("RANK");
    CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE("ZeRO-1 is AdamW's, and train.zero is 0 or 1", "[distributed]") {
    std::ostringstream log;
    const std::string dir = "/tmp/fg_distributed_zero_sgd";
    std::filesystem::remove_all(dir);
    CHECK_THROWS_WITH(Trainer(test::tiny_addition_run(dir, 2, {"train.zero=1", "optim.name=sgd"}),
                              log),
                      ContainsSubstring("[train] train.zero: 1 splits AdamW's state over the ranks, but "
                               "optim.name is sgd"));
    CHECK_FALSE(std::filesystem::exists(dir));
    CHECK_THROWS_WITH(test::tiny_addition_run(dir, 2, {"train.zero=2"}),
                      ContainsSubstring("train.zero: must be 0 to 1"));
    CHECK_THROWS_WITH(test::tiny_addition_run(dir, 2, {"train.bucket_mb=0"}),
                      ContainsSubstring("train.bucket_mb: must be in (0, 1e+06]"));
}

TEST_CASE("sharded dropout counters are one process's, split by rank", "[distributed]") {
    // A draw of 2 x 8 counters by one process, and each rank's 8 of it.
    Generator one(5), rank0(5), rank1(5);
    rank0.set_shard(0, 2);
    rank1.set_shard(1, 2);
    CHECK(one.advance_aligned(16) == 0);
    CHECK(rank0.advance_aligned(8) == 0);
    CHECK(rank1.advance_aligned(8) == 8);
    CHECK(rank0.offset() == one.offset());
    CHECK(rank1.offset() == one.offset());
    one.advance(3);  // unaligned: the next aligned draw starts at the next multiple of 4
    rank0.advance(3);
    rank1.advance(3);
    CHECK(one.advance_aligned(40) == 20);
    CHECK(rank0.advance_aligned(20) == 20);
    CHECK(rank1.advance_aligned(20) == 40);
    CHECK(rank0.offset() == one.offset());
    // Dropout on a rank's rows keeps what dropout on the whole batch keeps in those rows.
    Generator& g = default_generator();
    const Tensor x = Tensor::ones({4, 8});
    g.set_state(9, 0);
    const std::vector<float> whole = dropout(x, 0.5, true).to_vector<float>();
    for (int r = 0; r < 2; ++r) {
        g.set_state(9, 0);
        g.set_shard(r, 2);
        const std::vector<float> mine = dropout(x.slice(2 * r, 2 * r + 2), 0.5, true).to_vector<float>();
        CHECK(mine == std::vector<float>(whole.begin() + 16 * r, whole.begin() + 16 * (r + 1)));
    }
    g.set_shard(0, 1);
    CHECK(std::find(whole.begin(), whole.end(), 0.0f) != whole.end());  // some were dropped
}

TEST_CASE("TCP collectives run beside the caller, in order, and a failing rank does not wait",
          "[distributed]") {
    using Clock = std::chrono::steady_clock;
    const int world = 2, port = free_port();
    std::vector<float> sums[2];
    double queued_ms = 0, waited_ms = 0, torn_down_ms = 0;
    std::string errors[2];
    std::thread ranks[2];
    for (int r = 0; r < world; ++r) {
        ranks[r] = std::thread([&, r] {
            try {
                TcpGroup group(rank_env(r, world, port), 20.0);
                {
                    std::unique_ptr<Collectives> comm = tcp_collectives(group);
                    sums[r] = {float(r + 1), 10.0f};
                    std::vector<float> second{float(r), 0.5f};
                    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
                    const auto start = Clock::now();
                    comm->all_reduce_sum(sums[r].data(), 2, DType::f32);
                    comm->all_reduce_sum(second.data(), 2, DType::f32);
                    if (r == 0)
                        queued_ms =
                            std::chrono::duration<double, std::milli>(Clock::now() - start).count();
                    comm->wait();
                    if (r == 0)
                        waited_ms =
                            std::chrono::duration<double, std::milli>(Clock::now() - start).count();
                    CHECK(second == std::vector<float>{1.0f, 1.0f});  // the second sum came too
                }
                // Rank 0 queues a sum rank 1 never joins, and is torn down as a failing rank
                // is: it returns at once instead of waiting out the 20 s.
                group.barrier();
                if (r == 0) {
                    std::vector<float> lonely{1.0f};
                    const auto start = Clock::now();
                    {
                        std::unique_ptr<Collectives> comm = tcp_collectives(group);
                        comm->all_reduce_sum(lonely.data(), 1, DType::f32);
                        std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    }
                    torn_down_ms =
                        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
                } else {  // alive, but never joining: only the shutdown can end rank 0's wait
                    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
                }
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    }
    for (auto& t : ranks) t.join();
    CHECK(errors[0].empty());
    CHECK(sums[0] == std::vector<float>{3.0f, 20.0f});
    CHECK(sums[1] == std::vector<float>{3.0f, 20.0f});
    // Liveness, with wide margins (not speed): queued without waiting for rank 1 ...
    CHECK(queued_ms < 200.0);
    CHECK(waited_ms >= 250.0);  // ... which wait() then did
    CHECK(torn_down_ms < 2000.0);
}

TEST_CASE("the exchange over one rank: ZeRO-1's AdamW is AdamW, bit for bit", "[distributed]") {
    // The same two parameters twice: one set trained by AdamW, one through the exchange (tiny
    // buckets, so several) and ShardedAdamW; no clipping, so the updates must be the same bits.
    auto make = [] {
        Tensor a = test::random_f32({4, 3});
        Tensor b = test::random_f32({5});
        return std::pair<Tensor, Tensor>{a, b};
    };
    const auto [a0, b0] = make();
    Tensor ra = a0.clone(), rb = b0.clone(), za = a0.clone(), zb = b0.clone();
    for (Tensor* t : {&ra, &rb, &za, &zb}) t->set_requires_grad(true);
    AdamWOptions o;
    o.weight_decay = 0.1;
    AdamW reference({{"a", &ra}, {"b", &rb}}, o);
    TcpGroup group(DistributedEnv{}, 5.0);  // one rank: no sockets
    std::unique_ptr<Collectives> comm = tcp_collectives(group);
    const std::vector<NamedParam> params{{"a", &za}, {"b", &zb}};
    GradientExchange exchange(params, *comm, 0, 1, true, 16);
    ShardedAdamW sharded(params, o, exchange);
    REQUIRE(exchange.bucket_count() > 1);
    // loss = sum(a^2) + 3 sum(b^2): both parameters take part.
    auto loss_of = [](const Tensor& a, const Tensor& b) {
        return add(sum(mul(a, a)), scale(sum(mul(b, b)), 3.0));
    };
    // One step of each: AdamW's, and the trainer's sequence around ShardedAdamW's.
    auto reference_step = [&] {
        reference.zero_grad();
        loss_of(ra, rb).backward();
        reference.step(1e-2, grad_norm({&ra, &rb}, 0.0).coef);
    };
    auto sharded_step = [&](ShardedAdamW& opt) {
        opt.zero_grad();
        exchange.attach_gradients();
        exchange.arm();
        loss_of(za, zb).backward();
        CHECK(exchange.started_during_backward() == exchange.bucket_count());
        exchange.finish();
        opt.step(1e-2, exchange.grad_norm(0.0).coef);
    };
    // Before an exchange there are no gradients to update from, or to take a norm of.
    CHECK_THROWS_WITH(sharded.step(1e-2), ContainsSubstring("ZeRO-1's update needs the exchanged gradients"));
    CHECK_THROWS_WITH(exchange.grad_norm(1.0), ContainsSubstring("needs the exchanged gradients first"));
    for (int step = 1; step <= 3; ++step) {
        reference_step();
        sharded_step(sharded);
        INFO("step " << step);
        CHECK(za.to_vector<float>() == ra.to_vector<float>());
        CHECK(zb.to_vector<float>() == rb.to_vector<float>());
    }
    CHECK(sharded.state_bytes() >= reference.state_bytes());  // one rank: all of it (+ padding)

    // The state gathered whole for a checkpoint is AdamW's.
    sharded.gather_state();
    std::map<std::string, std::vector<float>> saved;
    for (auto& [name, t] : sharded.named_state()) {
        REQUIRE(t->defined());
        CHECK_FALSE(t->is_cuda());
        saved[name] = t->to_vector<float>();
    }
    for (auto& [name, t] : reference.named_state()) CHECK(saved.at(name) == t->to_vector<float>());
    sharded.shard_state();
    // Loaded back into a fresh ShardedAdamW (as a resume does), the next step is AdamW's.
    ShardedAdamW resumed(params, o, exchange);
    resumed.set_steps(3);
    resumed.prepare_state_load();
    for (auto& [name, t] : resumed.named_state())
        *t = Tensor::from_vector(saved.at(name), t->shape());
    resumed.shard_state();
    reference_step();
    sharded_step(resumed);
    CHECK(za.to_vector<float>() == ra.to_vector<float>());
    CHECK(zb.to_vector<float>() == rb.to_vector<float>());

    // A parameter the loss leaves out is named (AdamW alone would skip it; ranks cannot).
    resumed.zero_grad();
    exchange.attach_gradients();
    exchange.arm();
    sum(mul(za, za)).backward();
    CHECK_THROWS_WITH(exchange.finish(),
                      ContainsSubstring("parameter 'b' got no gradient in this step"));
}

TEST_CASE("a step after one cut short between arm() and finish() starts no bucket early",
          "[distributed]") {
    // A failed capture can end a step there; the eager step after it must start its buckets in
    // its own last backward only, as every other rank does.
    TcpGroup group(DistributedEnv{}, 5.0);  // one rank: no sockets
    std::unique_ptr<Collectives> comm = tcp_collectives(group);
    Tensor w = test::random_f32({4, 3});
    w.set_requires_grad(true);
    GradientExchange exchange({{"w", &w}}, *comm, 0, 1, false, 16);
    exchange.attach_gradients();
    exchange.arm();  // the step cut short
    exchange.attach_gradients();
    sum(mul(w, w)).backward();  // the next step's first micro-batch
    CHECK(exchange.started_during_backward() == 0);
    exchange.arm();
    sum(mul(w, w)).backward();  // its last
    CHECK(exchange.started_during_backward() == exchange.bucket_count());
    exchange.finish();
    CHECK(w.grad().to_vector<float>() == scale(w, 4.0).to_vector<float>());
}

TEST_CASE("the exchange refuses what it cannot send, naming it", "[distributed]") {
    TcpGroup group(DistributedEnv{}, 5.0);
    std::unique_ptr<Collectives> comm = tcp_collectives(group);
    Tensor w = Tensor::zeros({3});
    w.set_requires_grad(true);
    Tensor d = Tensor::zeros({3}, DType::f64);
    d.set_requires_grad(true);
    CHECK_THROWS_WITH(GradientExchange({{"w", &w}}, *comm, 0, 1, false, 16, DType::f16),
                      ContainsSubstring("[grad_exchange] gradients travel as f32 or bf16, not f16"));
    CHECK_THROWS_WITH(GradientExchange({{"w", &w}, {"d", &d}}, *comm, 0, 1, false, 16),
                      ContainsSubstring("parameter 'd' is f64 on cpu: the exchange takes f32 parameters"));
    GradientExchange plain({{"w", &w}}, *comm, 0, 1, false, 16);
    CHECK_THROWS_WITH(ShardedAdamW({{"w", &w}}, AdamWOptions{}, plain),
                      ContainsSubstring("ShardedAdamW needs an exchange with ZeRO-1 on"));
    // i32 sums are NCCL's (a captured rank step's device error codes); TCP sums none.
    std::int32_t codes[2] = {0, 1};
    CHECK_THROWS_WITH(comm->all_reduce_sum(codes, 2, DType::i32),
                      ContainsSubstring("[grad_exchange] CPU ranks sum f32 or bf16 values, not i32"));
    CHECK_THROWS_WITH(test::tiny_addition_run("/tmp/fg_exchange_dtype", 2,
                                              {"train.exchange_dtype=f16"}),
                      ContainsSubstring("train.exchange_dtype: must be one of auto, f32, bf16, "
                                        "got \"f16\""));
}

TEST_CASE("a rank sees when another closed its connection", "[distributed]") {
    const int port = free_port();
    std::string lost_before, lost_after;
    std::thread other([&] {
        TcpGroup group(rank_env(1, 2, port), 20.0);
        group.barrier();
    });  // rank 1 leaves after the barrier, closing its connection
    {
        TcpGroup group(rank_env(0, 2, port), 20.0);
        lost_before = group.peers_lost();
        group.barrier();
        other.join();
        lost_after = group.peers_lost();
    }
    CHECK(lost_before.empty());
    CHECK(lost_after == "rank 1 closed its connection (it stopped)");
}


TEST_CASE("a length a peer announces past what any message needs is refused, not allocated",
          "[distributed]") {
    // A fake rank 0: takes rank 1's hello, acknowledges and welcomes it as fusegrad's does, then
    // announces a broadcast of 2^40 bytes.
    const int port = free_port();
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(server >= 0);
    const int one = 1;
    ::setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    REQUIRE(::bind(server, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(server, 1) == 0);
    std::thread fake([server] {
        const int fd = ::accept(server, nullptr, nullptr);
        char hello[12 + kJobTokenMax];
        std::size_t got = 0;
        while (got < sizeof hello) {
            const ssize_t n = ::recv(fd, hello + got, sizeof hello - got, 0);
            if (n <= 0) break;
            got += static_cast<std::size_t>(n);
        }
        const std::uint32_t magic = 0x46475256;  // "FGRV": the ack, then the welcome
        ::send(fd, &magic, sizeof magic, MSG_NOSIGNAL);
        ::send(fd, &magic, sizeof magic, MSG_NOSIGNAL);
        const std::uint64_t huge = std::uint64_t{1} << 40;
        ::send(fd, &huge, sizeof huge, MSG_NOSIGNAL);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        ::close(fd);
    });
    {
        TcpGroup rank1(rank_env(1, 2, port), 5.0);
        CHECK_THROWS_WITH(rank1.broadcast({}),
                          ContainsSubstring("rank 0's broadcast announced 1099511627776 bytes, more than "
                                   "the 16777216 any such message can need"));
    }
    fake.join();
    ::close(server);
}
