// bench/bench_bpe.cpp: GPT-2 tokenizer speed (text/gpt2_bpe.h): encode MB/s of a text file on one
// thread, then on T threads each encoding its share of the file's lines (cut at line ends, as
// documents would be; the ids at the cuts may differ from the whole file's), the median of
// several runs each. A CPU benchmark: bench/bpe_speed.py runs it beside tiktoken on the same
// text and machine.
// usage: bench_bpe FILE [--threads T]... [--reps R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "text/gpt2_bpe.h"

namespace {

// The text in `parts` pieces of about equal size, each ending at a line end.
std::vector<std::string_view> split_lines(std::string_view text, int parts) {
    std::vector<std::string_view> out;
    std::size_t at = 0;
    for (int p = 0; p < parts && at < text.size(); ++p) {
        std::size_t end = p + 1 == parts ? text.size() : text.size() * (p + 1) / parts;
        end = std::min(text.size(), std::max(at, end));
        const std::size_t nl = text.find('\n', end);
        end = nl == std::string_view::npos ? text.size() : nl + 1;
        out.push_back(text.substr(at, end - at));
        at = end;
    }
    return out;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: bench_bpe FILE [--threads T]... [--reps R]\n");
        return 2;
    }
    std::vector<int> threads;
    int reps = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--threads") == 0) threads.push_back(std::atoi(argv[i + 1]));
        else if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    }
    if (threads.empty()) threads = {1, static_cast<int>(std::thread::hardware_concurrency())};
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "error: cannot read %s\n", argv[1]);
        return 1;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    try {
        const fg::text::Gpt2Tokenizer bpe = fg::text::Gpt2Tokenizer::load_installed();
        for (int t : threads) {
            const std::vector<std::string_view> parts = split_lines(text, std::max(1, t));
            std::vector<double> seconds;
            std::size_t ids = 0;
            for (int r = 0; r < reps; ++r) {
                std::vector<std::size_t> counts(parts.size());
                const auto start = std::chrono::steady_clock::now();
                std::vector<std::thread> pool;
                for (std::size_t p = 0; p < parts.size(); ++p)
                    pool.emplace_back([&, p] { counts[p] = bpe.encode(parts[p]).size(); });
                for (std::thread& th : pool) th.join();
                seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
                ids = 0;
                for (std::size_t c : counts) ids += c;
            }
            const double s = median(seconds);
            std::printf("fusegrad  threads %3d  %8.1f MB/s  %9zu ids  %.4f s\n", t,
                        static_cast<double>(text.size()) / s / 1e6, ids, s);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
