#!/usr/bin/env python3
"""bench/nanogpt_baseline.py: nanoGPT's own train.py on the baby GPT's task, as a baseline for
fusegrad's shakespeare_char run in the same GPU call.

nanoGPT is not part of this repository: pass the folder of a nanoGPT checkout (its train.py,
model.py and configurator.py are what run). This script writes the character-level dataset
nanoGPT's train.py reads (data/shakespeare_char/{train,val}.bin as uint16 ids and meta.pkl, the
first 90% of the text for training, as nanoGPT's own preparation splits it) from a text file, so
no download is needed; then runs train.py with config/train_shakespeare_char.py (6 x 384, 64 x
256 tokens a step, dropout 0.2, bf16 autocast, fused AdamW, torch.compile by default), logging
every step (each log line reads the loss back, so each step's time is the GPU's, as fusegrad's
host timing is), no evaluation after the first; and prints the median step time over the steps
after the warm-up (compilation) and the peak GPU memory PyTorch allocated.

usage: nanogpt_baseline.py NANOGPT_DIR TEXT_FILE [--steps N] [--no-compile] [--json OUT]
                          [--device cpu]   (fp32, for a check of this script without a GPU)
"""
import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys

import numpy as np

RUNNER = r"""
import atexit, runpy, sys, torch
if torch.cuda.is_available():
    atexit.register(lambda: print("peak_mem_mib %.1f" % (torch.cuda.max_memory_allocated() / 2**20),
                                  flush=True))
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


def write_dataset(nanogpt, text_file):
    folder = os.path.join(nanogpt, "data", "shakespeare_char")
    os.makedirs(folder, exist_ok=True)
    with open(text_file, "r") as f:
        data = f.read()
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[ch] for ch in data], dtype=np.uint16)
    split = int(len(ids) * 0.9)
    ids[:split].tofile(os.path.join(folder, "train.bin"))
    ids[split:].tofile(os.path.join(folder, "val.bin"))
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return len(chars)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("nanogpt")
    ap.add_argument("text")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    for f in ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py"):
        if not os.path.exists(os.path.join(args.nanogpt, f)):
            sys.exit("nanogpt_baseline.py: %s has no %s: pass a nanoGPT checkout" % (args.nanogpt, f))
    vocab = write_dataset(args.nanogpt, args.text)
    compiled = not args.no_compile and args.device == "cuda"
    command = [sys.executable, "-c", RUNNER, "config/train_shakespeare_char.py",
               "--max_iters=%d" % args.steps, "--log_interval=1", "--eval_interval=1000000",
               "--eval_iters=1", "--out_dir=/tmp/nanogpt-baseline-out", "--device=" + args.device,
               "--dtype=" + ("bfloat16" if args.device == "cuda" else "float32"),
               "--compile=%s" % compiled]
    run = subprocess.run(command, cwd=args.nanogpt, capture_output=True, text=True)
    log = run.stdout + run.stderr
    if run.returncode != 0:
        print(log[-4000:])
        sys.exit("nanogpt_baseline.py: train.py exited with %d" % run.returncode)
    times = {int(m.group(1)): float(m.group(2))
             for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", log)}
    losses = {int(m.group(1)): float(m.group(2))
              for m in re.finditer(r"iter (\d+): loss ([\d.]+)", log)}
    peak = re.search(r"peak_mem_mib ([\d.]+)", log)
    steady = [t for i, t in times.items() if i > 10]
    summary = {"framework": "nanoGPT train.py", "compile": compiled, "device": args.device,
               "vocab_size": vocab, "steps": args.steps,
               "median_ms_per_step": statistics.median(steady) if steady else None,
               "peak_mem_mib": float(peak.group(1)) if peak else None,
               "last_loss": losses[max(losses)] if losses else None}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
