"""bench/kernel_times.py: sums Nsight Compute's per-kernel durations by kernel name.

Input: the CSV of `ncu --metrics gpu__time_duration.sum --csv --print-units base ...` over a
window of launches. Prints the kernels by total time (µs, % of the window, launches), and the
window's time per training step when --per-step-kernel names a kernel launched a known number of
times per step (--per-step-count), e.g. the AdamW kernel once per parameter tensor.

usage: kernel_times.py NCU.csv [--top N] [--per-step-kernel NAME --per-step-count K]
"""
import argparse
import collections
import csv
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--per-step-kernel", default=None)
    ap.add_argument("--per-step-count", type=int, default=1)
    args = ap.parse_args()
    lines = open(args.csv).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    total = collections.Counter()
    count = collections.Counter()
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.sub(r"\(.*", "", row["Kernel Name"])[:90]
        total[name] += float(row["Metric Value"].replace(",", "")) / 1000.0  # ns -> µs
        count[name] += 1
    window = sum(total.values())
    steps = None
    if args.per_step_kernel:
        hits = sum(c for n, c in count.items() if args.per_step_kernel in n)
        steps = hits / args.per_step_count if hits else None
    print("window: %d launches, %.1f µs%s" % (sum(count.values()), window,
          ", %.2f steps, %.2f ms of kernels per step" % (steps, window / steps / 1000) if steps else ""))
    print("%10s %6s %7s  %s" % ("µs", "%", "calls", "kernel"))
    for name, us in total.most_common(args.top):
        print("%10.1f %6.1f %7d  %s" % (us, 100 * us / window, count[name], name))


if __name__ == "__main__":
    main()
