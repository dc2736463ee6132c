#!/usr/bin/env python3
"""bench/norm_report.py: merges bench_norm's JSON (fusegrad) and norm_torch.py's JSON (PyTorch)
from the same GPU call into one markdown table: GB/s and % of the copy bandwidth each run
measured, best PyTorch figure, and whether the KERNELS.md targets are met.

Usage: python3 bench/norm_report.py bench_norm.json norm_torch.json > table.md
"""
import json
import sys


def fwd_target(m, n):
    return 0.70 if (m, n) == (16384, 384) else 0.90


def bwd_target(m, n):
    if (m, n) == (16384, 384):
        return 0.50
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
    best = {}
    for r in torch["rows"]:
        key = (r["dtype"], r["norm"], r["shape"])
        b = best.setdefault(key, {"fwd": (0, ""), "bwd": (0, "")})
        if r["fwd_gbs"] > b["fwd"][0]:
            b["fwd"] = (r["fwd_gbs"], r["impl"])
        if r["bwd_gbs"] > b["bwd"][0]:
            b["bwd"] = (r["bwd_gbs"], r["impl"])
    pct = lambda v, c: f"{v:.0f} ({100 * v / c:.0f}%)"
    print(f"Device: {ours['device']}; copy bandwidth {copy:.0f} GB/s (fusegrad run), "
          f"{torch['copy_gbs']:.0f} GB/s (PyTorch run). GB/s (% of copy).\n")
    print("| dtype | norm | M x N | fwd | torch fwd (best) | bwd (b) grid | bwd (a) locked "
          "| unfused fwd / bwd | torch bwd (best) | fwd target | bwd target | faster than torch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (dtype, norm, shape), v in by.items():
        m, n = map(int, shape.split("x"))
        t = best.get((dtype, norm, shape), {"fwd": (0, "-"), "bwd": (0, "-")})
        tc = torch["copy_gbs"] or copy
        fwd_ok = v["fwd"] / copy >= fwd_target(m, n)
        bwd_ok = v["bwd grid"] / copy >= bwd_target(m, n)
        faster = v["fwd"] / copy > t["fwd"][0] / tc and v["bwd grid"] / copy > t["bwd"][0] / tc
        print(f"| {dtype} | {norm} | {shape} | {pct(v['fwd'], copy)} | "
              f"{pct(t['fwd'][0], tc)} {t['fwd'][1]} | {pct(v['bwd grid'], copy)} | "
              f"{pct(v['bwd locked'], copy)} | {v['unfused fwd']:.0f} / {v['unfused bwd']:.0f} | "
              f"{pct(t['bwd'][0], tc)} {t['bwd'][1]} | {'yes' if fwd_ok else 'no'} | "
              f"{'yes' if bwd_ok else 'no'} | {'yes' if faster else 'no'} |")


if __name__ == "__main__":
    main()
