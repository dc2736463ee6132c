#!/usr/bin/env python3
"""bench/gpt2_text_proof.py: GPT-2 small's architecture trained from scratch on real text by
fusegrad and by nanoGPT's own train.py, on the same tokens, batch, schedule and steps, a few seeds
each: the validation-loss curves (one SVG), fusegrad's curve against nanoGPT's seed-to-seed
spread, and a text sample from each. Needs a GPU.

1. `fusegrad prepare TEXT` twice: llm.c shards (what fusegrad trains on) and nanoGPT's raw
   train.bin / val.bin; the two must hold the same ids, or the script stops.
2. fusegrad: configs/gpt2_124m.yaml (12 x 768, 1024 tokens, biases, LayerNorm, tied head,
   vocabulary 50304, bf16) with nanoGPT's GELU (exact), no dropout, --batch sequences a step, no
   accumulation, AdamW 6e-4 -> 6e-5 (betas 0.9 / 0.95, decay 0.1, clip 1.0), --warmup steps of
   linear warm-up then a cosine to --steps; --eval-iters batches of validation every
   --eval-interval steps. A seed a run (train.seed).
3. nanoGPT: its train.py from the checkout, with the same settings through its own flags
   (--compile decides torch.compile; eager by default: the curves, not the speed, are measured
   here). train.py seeds torch with 1337 whatever it is told; the runner adds the run's seed to
   that number, and skips train.py's checkpoint writes (1.5 GB an evaluation, never read here).
4. Each run's validation losses as LABEL=metrics.jsonl, drawn by `fusegrad plot` into
   OUT/gpt2_text_val.svg (the numbers in OUT/gpt2_text_curves.json); OUT/gpt2_text_proof.md holds the table: at every evaluation, nanoGPT's
   lowest and highest validation loss over its seeds, fusegrad's, and whether fusegrad's mean lies
   within nanoGPT's range widened by nothing.
5. A sample of each framework's first seed after training, from the same prompt, temperature 0.8
   and the 200 likeliest tokens (nanoGPT's sample.py's defaults): fusegrad's `sample` of its last
   checkpoint; nanoGPT's model.generate (what sample.py calls) on the model as training left it,
   its prompt encoded and its output decoded by tiktoken from the same gpt2.tiktoken file.

usage: gpt2_text_proof.py --fusegrad BIN --nanogpt DIR --text FILE --work DIR --out DIR
                          [--seeds 1 2 3] [--steps 300] [--warmup 30] [--batch 8]
                          [--eval-interval 15] [--eval-iters 20] [--compile] [--prompt TEXT]
                          [--sample-tokens 120] [--vocab FILE]
The vocabulary is $FUSEGRAD_DATA/gpt2.tiktoken (--vocab to name another); tiktoken's encoding is
built from it by tests/text/gpt2_tiktoken.py.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Runs nanoGPT's train.py (cwd: the checkout) with argv[6:] as its flags, then samples from the
# model it trained. argv[1:6]: seed, vocabulary file, prompt, tokens to generate, sample seed;
# argv[6]: the folder of tests/text/gpt2_tiktoken.py.
RUNNER = r"""
import json, runpy, sys, torch
seed, vocab, prompt, n_new, sample_seed = sys.argv[1:6]
sys.path.insert(0, sys.argv[6])
from gpt2_tiktoken import local_encoding
_manual_seed = torch.manual_seed
torch.manual_seed = lambda s: _manual_seed(s + int(seed))
torch.save = lambda *args, **kwargs: None
sys.argv = ["train.py"] + sys.argv[7:]
g = runpy.run_path("train.py", run_name="__main__")
enc = local_encoding(vocab)
model = getattr(g["model"], "_orig_mod", g["model"])
model.eval()
_manual_seed(int(sample_seed))
x = torch.tensor(enc.encode(prompt), dtype=torch.long, device="cuda")[None]
with torch.no_grad(), g["ctx"]:
    y = model.generate(x, int(n_new), temperature=0.8, top_k=200)
print("SAMPLE " + json.dumps(enc.decode(y[0].tolist())), flush=True)
"""


def run(command, log, cwd=None):
    """Runs `command`, its output to `log`; stops the script, with the log's tail, if it fails."""
    with open(log, "w") as f:
        done = subprocess.run(command, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.stdout.write(open(log).read()[-3000:])
        sys.exit("gpt2_text_proof.py: %s exited with %d (log: %s)" % (command[0], done.returncode, log))
    return open(log).read()


def finished(log, last_words):
    """Whether the run logging to `log` got as far as printing `last_words`."""
    return os.path.exists(log) and last_words in open(log, errors="replace").read()


def read_ids(path, header_bytes):
    with open(path, "rb") as f:
        return f.read()[header_bytes:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fusegrad", required=True)
    ap.add_argument("--nanogpt", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--work", required=True, help="a new folder for tokens and runs, or one this script "
                    "made before: runs already finished there are read, not run again")
    ap.add_argument("--out", required=True, help="where the SVG, the table and the samples go")
    ap.add_argument("--vocab", default=os.path.join(os.environ.get("FUSEGRAD_DATA", ""), "gpt2.tiktoken"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-interval", type=int, default=15)
    ap.add_argument("--eval-iters", type=int, default=20)
    ap.add_argument("--compile", action="store_true", help="nanoGPT with torch.compile")
    ap.add_argument("--prompt", default="ROMEO:")
    ap.add_argument("--sample-tokens", type=int, default=120)
    a = ap.parse_args()
    for f in ("train.py", "model.py", "configurator.py"):
        if not os.path.exists(os.path.join(a.nanogpt, f)):
            sys.exit("gpt2_text_proof.py: %s has no %s: pass a nanoGPT checkout" % (a.nanogpt, f))
    if not os.path.isfile(a.vocab):
        sys.exit("gpt2_text_proof.py: no vocabulary at '%s' (set FUSEGRAD_DATA or --vocab)" % a.vocab)
    marker = os.path.join(a.work, ".gpt2_text_proof")
    if os.path.exists(a.work) and not os.path.exists(marker):
        sys.exit("gpt2_text_proof.py: '%s' exists and is not this script's; give a new folder" % a.work)
    os.makedirs(a.work, exist_ok=True)
    open(marker, "a").close()
    os.makedirs(a.out, exist_ok=True)
    fg, work = os.path.abspath(a.fusegrad), os.path.abspath(a.work)
    nanogpt = os.path.abspath(a.nanogpt)

    # 1. Tokens, twice; the same ids in both layouts.
    llmc, raw = os.path.join(work, "llmc"), os.path.join(work, "raw")
    if not os.path.exists(llmc):
        run([fg, "prepare", a.text, "--out", llmc, "--name", "text"], os.path.join(work, "prepare_llmc.log"))
        run([fg, "prepare", a.text, "--out", raw, "--name", "text", "--format", "raw_uint16"],
            os.path.join(work, "prepare_raw.log"))
    for split, shard in (("train", "text_train_000001.bin"), ("val", "text_val_000000.bin")):
        if read_ids(os.path.join(llmc, shard), 1024) != read_ids(os.path.join(raw, "text_%s.bin" % split), 0):
            sys.exit("gpt2_text_proof.py: the %s ids of the two layouts differ" % split)
    tokens = {s: os.path.getsize(os.path.join(raw, "text_%s.bin" % s)) // 2 for s in ("train", "val")}
    dataset = "fusegrad_gpt2_text"  # nanoGPT reads data/<dataset>/{train,val}.bin under its cwd
    data_dir = os.path.join(nanogpt, "data", dataset)
    os.makedirs(data_dir, exist_ok=True)
    for split in ("train", "val"):
        link = os.path.join(data_dir, split + ".bin")
        if os.path.lexists(link):
            os.remove(link)  # this script's own link from an earlier run
        os.symlink(os.path.join(raw, "text_%s.bin" % split), link)

    common = dict(steps=a.steps, warmup=a.warmup, batch=a.batch)
    curves = {}  # label -> {step: val_loss}
    samples = {}
    for seed in a.seeds:
        # 2. fusegrad.
        run_dir = os.path.join(work, "fusegrad_seed%d" % seed)
        sets = ["model.gelu=exact", "model.dropout=0", "data.path=" + os.path.join(llmc, "text_train_*.bin"),
                "data.val_path=" + os.path.join(llmc, "text_val_*.bin"), "train.steps=%d" % a.steps,
                "train.batch_size=%d" % a.batch, "train.grad_accum=1", "optim.lr=6e-4",
                "optim.min_lr=6e-5", "optim.warmup_steps=%d" % a.warmup, "optim.weight_decay=0.1",
                "optim.beta1=0.9", "optim.beta2=0.95", "optim.grad_clip=1.0",
                "train.eval_interval=%d" % a.eval_interval, "train.eval_iters=%d" % a.eval_iters,
                "train.checkpoint_interval=%d" % (a.steps + 1), "train.seed=%d" % seed,
                "train.out_dir=" + run_dir, "train.precision=bf16"]
        command = [fg, "train", os.path.join(HERE, "..", "configs", "gpt2_124m.yaml")]
        for s in sets:
            command += ["--set", s]
        log = os.path.join(work, "fusegrad_seed%d.log" % seed)
        if not finished(log, "eval step %d:" % a.steps):
            if os.path.exists(run_dir):
                os.rename(run_dir, run_dir + ".unfinished.%d" % os.getpid())  # kept, not deleted
            run(command, log)
        vals = {}
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            row = json.loads(line)
            if isinstance(row.get("val_loss"), (int, float)):
                vals[int(row["step"])] = float(row["val_loss"])
        curves["fusegrad seed %d" % seed] = vals
        if seed == a.seeds[0] and not finished(os.path.join(work, "fusegrad_sample.log"), a.prompt):
            run([fg, "sample", run_dir, "--prompt", a.prompt, "--max-new-tokens", str(a.sample_tokens),
                       "--temperature", "0.8", "--top-k", "200", "--seed", "1"],
                os.path.join(work, "fusegrad_sample.log"))
        if seed == a.seeds[0]:
            samples["fusegrad"] = open(os.path.join(work, "fusegrad_sample.log")).read()
        # 3. nanoGPT's train.py.
        flags = ["--dataset=" + dataset, "--out_dir=" + os.path.join(work, "nanogpt_seed%d" % seed),
                 "--n_layer=12", "--n_head=12", "--n_embd=768", "--block_size=1024", "--bias=True",
                 "--dropout=0.0", "--batch_size=%d" % a.batch, "--gradient_accumulation_steps=1",
                 "--max_iters=%d" % a.steps, "--lr_decay_iters=%d" % a.steps,
                 "--warmup_iters=%d" % a.warmup, "--learning_rate=6e-4", "--min_lr=6e-5",
                 "--beta1=0.9", "--beta2=0.95", "--weight_decay=0.1", "--grad_clip=1.0",
                 "--eval_interval=%d" % a.eval_interval, "--eval_iters=%d" % a.eval_iters,
                 "--log_interval=1", "--always_save_checkpoint=False", "--device=cuda",
                 "--dtype=bfloat16", "--compile=%s" % a.compile]
        helper_dir = os.path.join(HERE, "..", "tests", "text")  # gpt2_tiktoken.py
        log = os.path.join(work, "nanogpt_seed%d.log" % seed)
        if not finished(log, "SAMPLE "):
            run([sys.executable, "-c", RUNNER, str(seed), a.vocab, a.prompt, str(a.sample_tokens), "1",
                 helper_dir] + flags, log, cwd=nanogpt)
        log = open(log).read()
        curves["nanoGPT seed %d" % seed] = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
            r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", log)}
        if seed == a.seeds[0]:
            samples["nanoGPT"] = json.loads(re.search(r"^SAMPLE (.*)$", log, re.M).group(1))

    # 4. The curves (steps after 0: fusegrad evaluates after its first interval) and the table.
    with open(os.path.join(a.out, "gpt2_text_curves.json"), "w") as f:
        json.dump(curves, f, indent=1)
    plots = []
    for label, vals in sorted(curves.items()):
        path = os.path.join(work, re.sub(r"\W+", "_", label) + ".jsonl")
        with open(path, "w") as f:
            for step in sorted(vals):
                if step > 0:
                    f.write(json.dumps({"step": step, "val_loss": vals[step]}) + "\n")
        plots.append("%s=%s" % (label.split(" seed")[0], path))  # a colour a framework
    run([fg, "plot", os.path.join(a.out, "gpt2_text_val.svg"), "--title",
         "GPT-2 small from scratch on Shakespeare (GPT-2 tokens): validation loss"] + plots,
        os.path.join(work, "plot.log"))
    steps = sorted(set.intersection(*(set(s for s in v if s > 0) for v in curves.values())))
    lines = ["Tokens: %d training, %d validation (fusegrad prepare); %d steps of %d x 1024, "
             "warm-up %d, seeds %s; nanoGPT %s." % (tokens["train"], tokens["val"], a.steps, a.batch,
                                                   a.warmup, a.seeds, "compiled" if a.compile else "eager"),
             "", "| step | nanoGPT val (min-max) | fusegrad val (min-max) | fusegrad mean - nanoGPT mean | "
             "fusegrad's mean in nanoGPT's range |", "| --- | --- | --- | --- | --- |"]
    inside, diffs, spreads = 0, [], []
    for step in steps:
        ng = [v[step] for k, v in curves.items() if k.startswith("nanoGPT")]
        fgv = [v[step] for k, v in curves.items() if k.startswith("fusegrad")]
        ok = min(ng) <= statistics.mean(fgv) <= max(ng)
        inside += ok
        diffs.append(statistics.mean(fgv) - statistics.mean(ng))
        spreads.append(statistics.stdev(ng) if len(ng) > 1 else 0.0)
        lines.append("| %d | %.4f-%.4f | %.4f-%.4f | %+.4f | %s |" % (
            step, min(ng), max(ng), min(fgv), max(fgv), statistics.mean(fgv) - statistics.mean(ng),
            "yes" if ok else "no"))
    best = {k: min(v[s] for s in v if s > 0) for k, v in curves.items()}
    lines += ["", "fusegrad's mean within nanoGPT's range at %d of %d evaluations; fusegrad's mean minus "
              "nanoGPT's, averaged over them, %+.4f; nanoGPT's seed-to-seed standard deviation, averaged, "
              "%.4f." % (inside, len(steps), statistics.mean(diffs), statistics.mean(spreads)),
              "Lowest validation loss a run: " + ", ".join("%s %.4f" % kv for kv in best.items()), ""]
    for name, text in samples.items():
        lines += ["%s's sample (seed %d):" % (name, a.seeds[0]), "", "```", text.strip(), "```", ""]
    report = "\n".join(lines)
    with open(os.path.join(a.out, "gpt2_text_proof.md"), "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
