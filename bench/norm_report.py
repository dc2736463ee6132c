#!/usr/bin/env python3
"""bench/norm_report.py: merges bench_norm's JSON (fusegrad) and norm_torch.py's JSON (PyTorch)
from the same GPU call into one markdown table: GB/s and % of the copy bandwidth each run
measured, best PyTorch figure, and whether the project's targets (docs/norms.md section 2;
fwd_target and bwd_target below) are met. Forwards are compared
like with like: the training forward (y and the statistics) with PyTorch's forward on inputs that
require grad, the inference forward (y alone) with PyTorch's under no_grad. The forward target is
judged on the training forward. Ends with how many shapes are faster than PyTorch, pass by pass.

Usage: python3 bench/norm_report.py bench_norm.json norm_torch.json > table.md
"""
import json
import sys


# The project's widths (the baby GPT's 384, GPT-2 small's 768) have targets of their own.
def fwd_target(m, n):
    return {(16384, 384): 0.70, (16384, 768): 0.80}.get((m, n), 0.90)


def bwd_target(m, n):
    if (m, n) in ((16384, 384), (16384, 768)):
        return {384: 0.60, 768: 0.70}[n]
    return 0.80 if n <= 8192 else 0.70


def main():
    ours = json.load(open(sys.argv[1]))
    torch = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {"rows": [], "copy_gbs": 0}
    copy = ours["copy_gbs"]
    by = {}
    for r in ours["rows"]:
        if r["group"] != "norm":
            continue
        norm, dtype, *what = r["name"].split(" ")
        by.setdefault((dtype, norm, r["shape"]), {})[" ".join(what)] = r["value"]
    # PyTorch's figure for each pass, and the name of the pass in the verdict column.
    passes = {"fwd_train": "fwd", "fwd_infer": "fwd inference", "bwd": "bwd"}
    best = {}
    for r in torch["rows"]:
        key = (r["dtype"], r["norm"], r["shape"])
        b = best.setdefault(key, {k: (0, "-") for k in passes})
        for k in passes:
            if r[k + "_gbs"] > b[k][0]:
                b[k] = (r[k + "_gbs"], r["impl"])
    pct = lambda v, c: f"{v:.0f} ({100 * v / c:.0f}%)"
    print(f"Device: {ours['device']}; copy bandwidth {copy:.0f} GB/s (fusegrad run), "
          f"{torch['copy_gbs']:.0f} GB/s (PyTorch run). GB/s (% of copy).\n")
    print("| dtype | norm | M x N | fwd | torch fwd (best) | fwd inference | torch fwd inference "
          "(best) | bwd (b) grid | bwd (a) locked | unfused fwd / bwd | torch bwd (best) "
          "| fwd target | bwd target | faster than torch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    faster_count = {k: 0 for k in passes}
    for (dtype, norm, shape), v in by.items():
        m, n = map(int, shape.split("x"))
        t = best.get((dtype, norm, shape), {k: (0, "-") for k in passes})
        tc = torch["copy_gbs"] or copy
        ours_of = {"fwd_train": v["fwd"], "fwd_infer": v["fwd inference"], "bwd": v["bwd grid"]}
        slower = [k for k in passes if not ours_of[k] / copy > t[k][0] / tc]
        for k in passes:
            faster_count[k] += k not in slower
        verdict = "yes" if not slower else "no: " + ", ".join(passes[k] for k in slower)
        fwd_ok = v["fwd"] / copy >= fwd_target(m, n)
        bwd_ok = v["bwd grid"] / copy >= bwd_target(m, n)
        print(f"| {dtype} | {norm} | {shape} | {pct(v['fwd'], copy)} | "
              f"{pct(t['fwd_train'][0], tc)} {t['fwd_train'][1]} | "
              f"{pct(v['fwd inference'], copy)} | {pct(t['fwd_infer'][0], tc)} {t['fwd_infer'][1]} | "
              f"{pct(v['bwd grid'], copy)} | {pct(v['bwd locked'], copy)} | "
              f"{v['unfused fwd']:.0f} / {v['unfused bwd']:.0f} | "
              f"{pct(t['bwd'][0], tc)} {t['bwd'][1]} | {'yes' if fwd_ok else 'no'} | "
              f"{'yes' if bwd_ok else 'no'} | {verdict} |")
    print(f"\nFaster than the best PyTorch figure: fwd (training) at {faster_count['fwd_train']} "
          f"of {len(by)} shapes, fwd inference at {faster_count['fwd_infer']}, backward at "
          f"{faster_count['bwd']}.")

if __name__ == "__main__":
    main()
