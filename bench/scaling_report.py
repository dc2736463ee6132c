"""bench/scaling_report.py: the table of a `scripts/gpu_check.sh ddp` run: tokens/s of each
model and trainer on 1, 2, 4, ... GPUs, and the scaling efficiency, tokens/s on N GPUs over N
times tokens/s on one GPU (the same trainer and model; each GPU keeps the same batch, so the
global batch grows with N).

Run directories are named TRAINER_MODEL_N (e.g. fusegrad-zero1_gpt2_4,
torch-ddp-compile_baby_2): fusegrad's hold metrics.jsonl, PyTorch's summary.json and
metrics.jsonl. The median step time leaves out
the first 10 steps (warm-up, compilation, the capture).

usage: scaling_report.py RUNS_DIR
"""
import collections
import json
import os
import re
import statistics
import sys


def tokens_per_s(run_dir):
    rows = []
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    for line in open(path):
        row = json.loads(line)
        if "ms" in row:
            rows.append(row)
    if not rows:
        return None
    late = [r for r in rows if r["step"] > 10] or rows
    ms = statistics.median(r["ms"] for r in late)
    tokens_per_step = rows[-1]["tokens_per_s"] * rows[-1]["ms"] / 1000
    peak = rows[-1].get("peak_mem_mib")
    summary = os.path.join(run_dir, "summary.json")
    if peak is None and os.path.exists(summary):
        peak = json.load(open(summary)).get("peak_mem_mib")
    return {"ms": ms, "tokens_per_s": tokens_per_step / ms * 1000, "peak_mib": peak}


def main():
    runs = sys.argv[1]
    table = collections.defaultdict(dict)  # (model, trainer) -> {gpus: result}
    for name in sorted(os.listdir(runs)):
        m = re.fullmatch(r"(.+)_(.+)_(\d+)", name)
        if not m or not os.path.isdir(os.path.join(runs, name)):
            continue
        result = tokens_per_s(os.path.join(runs, name))
        if result:
            table[(m.group(2), m.group(1))][int(m.group(3))] = result
    print("| model | trainer | GPUs | ms/step | tokens/s | scaling efficiency | peak MiB (rank 0) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (model, trainer), by_gpus in sorted(table.items()):
        one = by_gpus.get(1)
        for gpus, r in sorted(by_gpus.items()):
            eff = "%.1f%%" % (100 * r["tokens_per_s"] / (gpus * one["tokens_per_s"])) if one else ""
            peak = "%.0f" % r["peak_mib"] if r["peak_mib"] is not None else ""
            print("| %s | %s | %d | %.2f | %.0f | %s | %s |" % (model, trainer, gpus, r["ms"],
                                                              r["tokens_per_s"], eff, peak))


if __name__ == "__main__":
    main()
