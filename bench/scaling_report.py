"""bench/scaling_report.py: the table of a `scripts/gpu_check.sh ddp` run: tokens/s of each
model and trainer on 1, 2, 4, ... GPUs, and the scaling efficiency, tokens/s on N GPUs over N
times tokens/s on one GPU (the same trainer and model; each GPU keeps the same batch, so the
global batch grows with N).

Run directories are named TRAINER_MODEL_N (e.g. fusegrad-zero1_gpt2_4,
torch-ddp-compile_baby_2): fusegrad's hold metrics.jsonl, PyTorch's summary.json and
metrics.jsonl. The median step time leaves out
the first 10 steps (warm-up, compilation, the capture). nanoGPT's model.py under DDP
(bench/nanogpt_gpt2.py) leaves a log, nanogpt_MODEL_N.log, whose last line is its summary (JSON:
median_ms_per_step, tokens_per_s, peak_mem_mib): its rows are trainer nanogpt-ddp-compile, and
the last column gives each other row's tokens/s against nanoGPT's on as many GPUs.

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


def nanogpt_summary(log_path):
    """The summary line bench/nanogpt_gpt2.py prints last, or None (a run that failed)."""
    lines = [line for line in open(log_path) if line.startswith("{")]
    try:
        s = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    if not s or "median_ms_per_step" not in s:
        return None
    return {"ms": s["median_ms_per_step"], "tokens_per_s": s["tokens_per_s"],
            "peak_mib": s.get("peak_mem_mib")}


def main():
    runs = sys.argv[1]
    table = collections.defaultdict(dict)  # (model, trainer) -> {gpus: result}
    for name in sorted(os.listdir(runs)):
        m = re.fullmatch(r"(.+)_(.+)_(\d+)", name)
        log = re.fullmatch(r"nanogpt_(.+)_(\d+)\.log", name)
        if log:
            result = nanogpt_summary(os.path.join(runs, name))
            if result:
                table[(log.group(1), "nanogpt-ddp-compile")][int(log.group(2))] = result
            continue
        if not m or not os.path.isdir(os.path.join(runs, name)):
            continue
        result = tokens_per_s(os.path.join(runs, name))
        if result:
            table[(m.group(2), m.group(1))][int(m.group(3))] = result
    anchor = "nanogpt-ddp-compile"  # the trainer fusegrad's rows are compared with
    print("| model | trainer | GPUs | ms/step | tokens/s | scaling efficiency | peak MiB (rank 0) "
          "| tokens/s against nanoGPT's on as many GPUs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (model, trainer), by_gpus in sorted(table.items()):
        one = by_gpus.get(1)
        for gpus, r in sorted(by_gpus.items()):
            eff = "%.1f%%" % (100 * r["tokens_per_s"] / (gpus * one["tokens_per_s"])) if one else ""
            peak = "%.0f" % r["peak_mib"] if r["peak_mib"] is not None else ""
            o = table.get((model, anchor), {}).get(gpus)
            versus = "%.2fx" % (r["tokens_per_s"] / o["tokens_per_s"]) if o and trainer != anchor \
                else ""
            print("| %s | %s | %d | %.2f | %.0f | %s | %s | %s |" % (
                model, trainer, gpus, r["ms"], r["tokens_per_s"], eff, peak, versus))


if __name__ == "__main__":
    main()
