"""bench/train_report.py: the table of a `scripts/gpu_check.sh shakespeare` run: per run (fusegrad
and each PyTorch mode) the median step time (warm-up left out), tokens/s, peak GPU memory, the
validation loss at step 1000 and the best validation loss with its step.

usage: train_report.py OUT_DIR   (reads OUT_DIR/fusegrad*/ and OUT_DIR/torch_*/)
"""
import glob
import json
import os
import statistics
import sys


def summarise_metrics(path):
    steps, evals = [], []
    for line in open(path):
        row = json.loads(line)
        (evals if "val_loss" in row else steps).append(row)
    if not steps:
        return None
    # Leave out warm-up, and the steps that followed an evaluation or checkpoint.
    eval_steps = {e["step"] for e in evals}
    ms = [s["ms"] for s in steps[10:] if s["step"] - 1 not in eval_steps] or [s["ms"] for s in steps]
    best = min(evals, key=lambda e: e["val_loss"]) if evals else None
    at_1000 = [e["val_loss"] for e in evals if e["step"] == 1000]
    median = statistics.median(ms)
    tokens_per_step = steps[-1]["tokens_per_s"] * steps[-1]["ms"] / 1000
    return {"median_ms_per_step": median, "tokens_per_s": tokens_per_step / median * 1000,
            "peak_mem_mib": steps[-1].get("peak_mem_mib"), "val_loss_at_1000": at_1000[0] if at_1000 else None,
            "best_val_loss": best["val_loss"] if best else None, "best_val_step": best["step"] if best else None,
            "steps": steps[-1]["step"]}


def main():
    out = sys.argv[1]
    rows = []
    for d in sorted(glob.glob(os.path.join(out, "fusegrad*", ""))):
        fg = os.path.join(d, "metrics.jsonl")
        if not os.path.exists(fg):
            continue
        config = open(os.path.join(d, "config.yaml")).read()
        precision = "fp32"
        for line in config.splitlines():
            words = line.split("#")[0].split()
            if words[:1] == ["precision:"]:
                precision = words[1].strip('"')
        rows.append(("fusegrad " + precision, summarise_metrics(fg)))
    for d in sorted(glob.glob(os.path.join(out, "torch_*", ""))):
        path = os.path.join(d, "summary.json")
        summary = json.load(open(path)) if os.path.exists(path) else {}
        s = summarise_metrics(os.path.join(d, "metrics.jsonl"))
        if s is None:
            continue
        s["peak_mem_mib"] = summary.get("peak_mem_mib")
        label = "%s %s%s" % (summary.get("framework", "pytorch"), summary.get("mode", "?"),
                             " compile" if summary.get("compile") else " eager")
        rows.append((label, s))
    fmt = lambda v, f: "-" if v is None else f % v
    print("| run | steps | ms/step (median) | tokens/s | peak GPU memory | val loss @1000 | best val loss (step) |")
    print("|---|---|---|---|---|---|---|")
    for label, s in rows:
        print("| %s | %d | %.2f | %s | %s | %s | %s |" % (
            label, s["steps"], s["median_ms_per_step"], fmt(s["tokens_per_s"], "%.0f"),
            fmt(s["peak_mem_mib"], "%.0f MiB"), fmt(s["val_loss_at_1000"], "%.4f"),
            "-" if s["best_val_loss"] is None else "%.4f (%d)" % (s["best_val_loss"], s["best_val_step"])))


if __name__ == "__main__":
    main()
