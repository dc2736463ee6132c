#!/usr/bin/env python3
"""bench/bpe_speed.py: GPT-2 tokenizer speed, fusegrad's (build/.../bench_bpe) beside tiktoken's on
the same text and machine: encode MB/s on one thread and on all (tiktoken's encode_ordinary_batch
over the same line-aligned shares), the median of several runs each.

usage: bpe_speed.py BENCH_BPE VOCAB_FILE TEXT_FILE [--reps R]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "text"))
from gpt2_tiktoken import local_encoding  # noqa: E402  (tests/text/gpt2_tiktoken.py)


def shares(text, parts):
    out, at = [], 0
    for p in range(parts):
        end = len(text) if p + 1 == parts else max(at, len(text) * (p + 1) // parts)
        nl = text.find("\n", end)
        end = len(text) if nl < 0 or p + 1 == parts else nl + 1
        out.append(text[at:end])
        at = end
    return [s for s in out if s]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("vocab")
    ap.add_argument("text")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    threads = os.cpu_count()
    print(subprocess.run([a.bench, a.text, "--threads", "1", "--threads", str(threads),
                          "--reps", str(a.reps)], check=True, capture_output=True,
                         text=True).stdout, end="")
    enc = local_encoding(a.vocab)
    data = open(a.text, "rb").read()
    text = data.decode("utf-8")
    for t in (1, threads):
        parts = shares(text, t)
        times = []
        for _ in range(a.reps):
            start = time.perf_counter()
            ids = enc.encode_ordinary_batch(parts, num_threads=t) if t > 1 else [enc.encode_ordinary(text)]
            times.append(time.perf_counter() - start)
        s = statistics.median(times)
        print("tiktoken  threads %3d  %8.1f MB/s  %9d ids  %.4f s" % (
            t, len(data) / s / 1e6, sum(len(i) for i in ids), s))


if __name__ == "__main__":
    main()
