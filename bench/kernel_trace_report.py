#!/usr/bin/env python3
"""bench/kernel_trace_report.py: a training step's kernels as they ran, from the file
libfg_kernel_trace.so wrote (bench/kernel_trace.cpp).

The window is whole steps: from the end of the SKIP-th launch of the marker kernel (one that runs
once a step: fusegrad's cross_entropy_one_pass_kernel, nanoGPT's compiled log-softmax kernel) to
the end of the (SKIP + STEPS)-th. Prints per step the window's wall time, the time the GPU ran at
least one kernel, the kernels' summed time, their time by kind (matrix products, attention, norms,
...; names of fusegrad's kernels, cuBLAS / cuBLASLt, cuDNN and Triton's fused kernels alike), the
longest kernels, copies and memsets, and the longest gaps with nothing running, by what ran on
either side. Memory copies and memsets count as a kind of their own ("[memcpy ...]", "[memset
...]": a trace from before the library recorded them has none, and shows them as gaps): "GPU busy"
is the time some kernel, copy or memset ran, and "kernels" counts the kernels alone. Last, the
memset calls by the library that made them (the trace's "# memset" lines), over the whole run.

usage: kernel_trace_report.py TRACE --marker NAME [--skip 20] [--steps 20] [--top 25] [--gaps 8]
                              [--label L]
"""
import argparse
import collections
import subprocess

KINDS = [  # (kind, substrings of the lower-cased name), the first match wins
    ("copies and memsets", ("[memcpy", "[memset")),
    ("attention", ("sdpa", "cudnn", "flash", "fmha")),
    ("matrix products", ("gemm", "xmma", "nvjet", "cutlass", "splitkreduce")),
    ("optimizer, gradient norm", ("adam", "multi_tensor", "sum_squares", "lpnorm")),
    ("norms", ("norm_", "layer_norm")),
    ("cross-entropy", ("cross_entropy", "log_softmax", "nll")),
    ("GELU (separate kernels)", ("gelu",)),
    ("sums (fusegrad: bias grads)", ("column_chunk", "sum")),
    ("casts", ("cast_kernel", "to_copy")),
]


def kind_of(name):
    lower = name.lower()
    for kind, keys in KINDS:
        if any(k in lower for k in keys):
            return kind
    return "other"


def demangled(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.split("\n")
        return dict(zip(names, out))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--marker", required=True)
    ap.add_argument("--skip", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--gaps", type=int, default=8)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    kernels, memset_calls = [], []
    for number, line in enumerate(open(a.trace), 1):
        if line.startswith("# memset "):  # API:library, bytes, calls
            fields = line.split()
            if len(fields) != 5 or not fields[3].isdigit() or not fields[4].isdigit():
                raise SystemExit(f"{a.trace}:{number}: not '# memset API:LIBRARY BYTES CALLS' (a "
                                 f"trace cut short?): {line.strip()[:80]!r}")
            memset_calls.append(fields[2:5])
            continue
        fields = line.rstrip("\n").split(" ", 2)
        if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
            raise SystemExit(f"{a.trace}:{number}: not 'start_ns end_ns name' (a trace cut short "
                             f"when its process was killed?): {line.strip()[:80]!r}")
        kernels.append((int(fields[0]), int(fields[1]), fields[2]))
    kernels.sort()
    marks = [k for k in kernels if a.marker in k[2]]
    if len(marks) <= a.skip + a.steps:
        raise SystemExit(f"{a.trace}: {len(marks)} launches of a kernel named like '{a.marker}', "
                         f"fewer than --skip + --steps + 1 = {a.skip + a.steps + 1}")
    lo, hi = marks[a.skip][1], marks[a.skip + a.steps][1]
    window = [k for k in kernels if lo < k[0] <= hi]
    names = demangled(sorted({k[2] for k in window}))
    time, launches = collections.Counter(), collections.Counter()
    gap_time, gap_count = collections.Counter(), collections.Counter()
    busy, covered, last = 0, lo, names.get(marks[a.skip][2], marks[a.skip][2])
    for start, end, name in window:
        end = min(end, hi)  # a kernel on another stream may run past the window's last marker
        time[names[name]] += end - start
        launches[names[name]] += 1
        if start > covered:  # nothing ran from the last kernel's end to this one's start
            gap_time[(last, names[name])] += start - covered
            gap_count[(last, names[name])] += 1
        if end > covered:
            busy += end - max(start, covered)
            covered, last = end, names[name]
    summed = sum(time.values())
    copies = {n for n in time if n.startswith(("[memcpy", "[memset"))}
    per_step = lambda ns: ns / a.steps / 1e6  # noqa: E731
    print(f"{a.label or a.trace}: {a.steps} steps; a step: {per_step(hi - lo):.2f} ms wall, "
          f"GPU busy {per_step(busy):.2f} ms, kernels summed "
          f"{per_step(sum(ns for n, ns in time.items() if n not in copies)):.2f} ms, "
          f"{sum(c for n, c in launches.items() if n not in copies) / a.steps:.0f} kernels; "
          f"copies and memsets: {sum(launches[n] for n in copies) / a.steps:.0f}")
    print("  by kind (ms a step, share of the kernels', copies' and memsets' summed time):")
    by_kind = collections.Counter()
    for name, ns in time.items():
        by_kind[kind_of(name)] += ns
    for kind, ns in by_kind.most_common():
        print(f"  {kind:30s} {per_step(ns):8.3f} ms  {100 * ns / summed:5.1f}%")
    print("  the longest kernels, copies and memsets (ms a step, launches a step, name):")
    for name, ns in time.most_common(a.top):
        print(f"  {per_step(ns):8.3f} {launches[name] / a.steps:6.1f}  {name[:140]}")
    print("  the longest gaps with nothing running (ms a step, gaps a step, what ran before / "
          "after):")
    for (before, after), ns in gap_time.most_common(a.gaps):
        print(f"  {per_step(ns):8.3f} {gap_count[(before, after)] / a.steps:6.1f}  "
              f"{before[:70]}  /  {after[:70]}")

    if memset_calls:
        print("  memset calls over the whole run, by the library that made them (a captured "
              "step's once, at its capture): calls, bytes each, API:library")
        for library, size, calls in sorted(memset_calls, key=lambda m: -int(m[2])):
            print(f"  {int(calls):8d} {int(size):12d}  {library}")


if __name__ == "__main__":
    main()
