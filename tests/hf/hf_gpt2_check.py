#!/usr/bin/env python3
"""tests/hf/hf_gpt2_check.py: `fusegrad import --hf` and `fusegrad export --hf` against
transformers' own GPT2LMHeadModel (pip, in build/hf: scripts/install_deps.sh --tests; nothing is
downloaded: every model is random-initialised here).

1. In: a random GPT2LMHeadModel (its LayerNorms and biases perturbed too, so that no tensor is
   its default), saved by save_pretrained, is imported; fusegrad's logits for the same ids equal
   transformers' within TOL. Both GELUs (gelu_new, gelu), and the hub's layout (names without
   "transformer.", no lm_head.weight, the attention masks' buffers in the file).
2. Out: fusegrad runs trained a few steps (GPT-2's shape with a padded vocabulary; a character
   run without biases, exact GELU) are exported; transformers' from_pretrained loads them, and its
   logits equal fusegrad's within TOL; the padding rows are gone (vocab_size is the run's).
3. Round trip: an imported export exports the same tensors bit for bit, and gives bitwise the
   logits of the run it came from (within a few units in the last place where the run's head
   had padding rows).
4. Refusals: an export over an existing model.safetensors, an import of another activation.
5. Fine-tuning: a run started from imported weights (train.init_from) has them, bit for bit;
   weights of another shape, or of another model (head count, GELU) of the same shapes, are
   refused.

usage: hf_gpt2_check.py FUSEGRAD FG_LOGITS_DUMP   (exit 77: transformers is not installed)
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "hf"))
try:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:  # CI installs it (scripts/install_deps.sh --tests)
    print(f"skipped: {e} (scripts/install_deps.sh --tests installs transformers in build/hf)")
    sys.exit(77)

# The largest |logit difference| allowed, f32 on the CPU: the two compute the same products in
# other orders (and GELU's erf or tanh by other code), logits of size about 1.
TOL = 1e-4

fusegrad, dump = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="fg_hf_")
atexit.register(shutil.rmtree, work, True)  # also when a check fails
torch.manual_seed(0)


def run(*args, expect_error=None):
    p = subprocess.run([fusegrad, *args], capture_output=True, text=True)
    if expect_error is None:
        if p.returncode != 0:
            sys.exit(f"fusegrad {' '.join(args)} failed:\n{p.stdout}{p.stderr}")
        return p.stdout
    if p.returncode == 0 or expect_error not in p.stderr:
        sys.exit(f"fusegrad {' '.join(args)}: expected an error with {expect_error!r}, got "
                 f"exit {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stderr


def fg_logits(run_dir, ids):
    out = os.path.join(work, "logits.safetensors")
    subprocess.run([dump, run_dir, out, str(ids.shape[1])] + [str(i) for i in ids.flatten().tolist()],
                   check=True)
    return load_file(out)["logits"]


def compare(what, ours, theirs, tol=TOL):
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    diff = (ours - theirs).abs().max().item()
    print(f"{what}: max |logit difference| {diff:.2e} (tolerance {tol:g})")
    if diff > tol:
        sys.exit(f"{what}: logits differ by {diff}")


def random_gpt2(activation, vocab=100):
    config = GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        activation_function=activation, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # wte and the head are one tensor: they stay tied
            p.add_(0.05 * torch.randn_like(p))
    return model


ids = torch.randint(0, 100, (2, 16))

# 1. In.
for activation in ("gelu_new", "gelu"):
    model = random_gpt2(activation)
    hf_in = os.path.join(work, f"hf_{activation}")
    model.save_pretrained(hf_in, safe_serialization=True)
    run_dir = os.path.join(work, f"run_{activation}")
    print(run("import", "--hf", hf_in, "--out", run_dir).strip())
    with torch.no_grad():
        compare(f"import ({activation})", fg_logits(run_dir, ids), model(ids).logits)
# The hub's layout: names without "transformer.", no lm_head.weight, the causal masks' buffers.
hub = os.path.join(work, "hf_hub")
os.makedirs(hub)
state = {k.removeprefix("transformer."): v.contiguous() for k, v in model.state_dict().items()
         if k != "lm_head.weight"}
for layer in range(2):
    state[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(32, 32)).view(1, 1, 32, 32)
save_file(state, os.path.join(hub, "model.safetensors"), metadata={"format": "pt"})
shutil.copy(os.path.join(hf_in, "config.json"), hub)
run("import", "--hf", hub, "--out", os.path.join(work, "run_hub"))
with torch.no_grad():
    compare("import (the hub's layout)", fg_logits(os.path.join(work, "run_hub"), ids),
            model(ids).logits)

# 2. Out: GPT-2's shape on random ids (vocabulary 100, padded to 128 in the model), and a
# character run without biases (exact GELU).
gpt2_run = os.path.join(work, "fg_gpt2")
run("train", "configs/gpt2_124m.yaml", "--set", "data.kind=random_tokens", "--set",
    "data.vocab_size=100", "--set", "model.vocab_size=128", "--set", "model.n_layer=2",
    "--set", "model.n_head=4", "--set", "model.n_embd=32", "--set", "model.block_size=32",
    "--set", "train.batch_size=4", "--set", "train.grad_accum=1", "--set", "train.steps=3",
    "--set", "train.eval_iters=1", "--set", "train.device=cpu", "--set", "train.precision=fp32",
    "--set", f"train.out_dir={gpt2_run}")
char_run = os.path.join(work, "fg_char")
run("train", "configs/shakespeare_char.yaml", "--set", "data.path=README.md", "--set",
    "model.n_layer=2", "--set", "model.n_head=2", "--set", "model.n_embd=32", "--set",
    "model.block_size=32", "--set", "train.steps=3", "--set", "train.batch_size=4", "--set",
    "train.eval_iters=1", "--set", "train.device=cpu", "--set", "train.precision=fp32", "--set",
    f"train.out_dir={char_run}")
for name, run_dir, vocab in (("GPT-2's shape", gpt2_run, 100), ("characters, no biases", char_run, None)):
    hf_out = os.path.join(work, "out_" + os.path.basename(run_dir))
    run("export", run_dir, "--hf", hf_out)
    config = json.load(open(os.path.join(hf_out, "config.json")))
    if vocab is not None:
        assert config["vocab_size"] == vocab, config["vocab_size"]  # the padding rows left out
    loaded = GPT2LMHeadModel.from_pretrained(hf_out).eval()
    char_ids = torch.randint(0, config["vocab_size"], (2, 16))
    with torch.no_grad():
        compare(f"export ({name})", fg_logits(run_dir, char_ids), loaded(char_ids).logits)
    # 3. Round trip: the export imported again holds the exported weights bit for bit (its own
    # export is the same tensors), and gives the run's logits bit for bit where the two models
    # are the same shape. The GPT-2-shaped run's head has padding rows (128 for 100 tokens) that
    # the export leaves out, so its head's product is another width, and a CPU BLAS may then sum
    # a column in another order (seen: 6e-8 on one machine, 0 on another): a few units in the
    # last place of the f32 logits are allowed there.
    again = os.path.join(work, "again_" + os.path.basename(run_dir))
    run("import", "--hf", hf_out, "--out", again)
    run("export", again, "--hf", again + "_hf")
    first = load_file(os.path.join(hf_out, "model.safetensors"))
    second = load_file(os.path.join(again + "_hf", "model.safetensors"))
    assert first.keys() == second.keys(), (name, sorted(first.keys() ^ second.keys()))
    for key in first:
        assert torch.equal(first[key], second[key]), (name, key)
    print(f"export, import, export ({name}): {len(first)} tensors, bit for bit")
    compare(f"export, then import ({name})", fg_logits(again, char_ids), fg_logits(run_dir, char_ids),
            tol=0.0 if vocab is None else 1e-6)

# 5. Fine-tuning starts from the imported weights (train.init_from): with a learning rate of 1e-30
# (below f32's resolution of any weight here), a step leaves them as they were, and the new run's
# logits are the imported model's, bit for bit.
tuned = os.path.join(work, "tuned")
shape = ["--set", "model.n_layer=2", "--set", "model.n_head=4", "--set", "model.n_embd=32",
         "--set", "model.block_size=32", "--set", "model.vocab_size=100"]
start = ["train", "configs/gpt2_124m.yaml", "--set", "data.kind=random_tokens", "--set",
         "data.vocab_size=100", *shape, "--set", "train.batch_size=2", "--set",
         "train.grad_accum=1", "--set", "train.steps=1", "--set", "train.eval_iters=1", "--set",
         "train.device=cpu", "--set", "train.precision=fp32", "--set", "optim.lr=1e-30", "--set",
         "optim.min_lr=1e-31"]
run(*start, "--set", f"train.init_from={os.path.join(work, 'run_gelu_new', 'model.safetensors')}",
    "--set", f"train.out_dir={tuned}")
compare("init_from, one step at lr 1e-30", fg_logits(tuned, ids),
        fg_logits(os.path.join(work, "run_gelu_new"), ids), tol=0.0)
run(*start, "--set", f"train.init_from={os.path.join(gpt2_run, 'model.safetensors')}", "--set",
    f"train.out_dir={os.path.join(work, 'tuned_wrong')}", expect_error="has shape")
# 16-bit weights (a file of another trainer's, say) start f32 master weights: a run made from
# them resumes.
half = os.path.join(work, "half")
os.makedirs(half)
weights = load_file(os.path.join(work, "run_gelu_new", "model.safetensors"))
save_file({k: v.to(torch.bfloat16) for k, v in weights.items()},
          os.path.join(half, "model.safetensors"), metadata={"format": "pt"})
from_half = os.path.join(work, "from_half")
run(*start, "--set", "optim.name=sgd", "--set",
    f"train.init_from={os.path.join(half, 'model.safetensors')}", "--set",
    f"train.out_dir={from_half}")
run("train", "--resume", from_half, "--set", "train.steps=2")
# Same shapes, another model: two heads, or the exact GELU, named from the config.yaml beside it.
run(*[a.replace("model.n_head=4", "model.n_head=2") for a in start], "--set",
    f"train.init_from={os.path.join(work, 'run_gelu_new', 'model.safetensors')}", "--set",
    f"train.out_dir={os.path.join(work, 'tuned_heads')}",
    expect_error="differs from this one: model.n_head (4 -> 2)")
run(*start, "--set", f"train.init_from={os.path.join(work, 'run_gelu', 'model.safetensors')}",
    "--set", f"train.out_dir={os.path.join(work, 'tuned_gelu')}",
    expect_error='model.gelu ("exact" -> "tanh")')

# 4. Refusals.
run("export", gpt2_run, "--hf", os.path.join(work, "out_fg_gpt2"),
    expect_error="model.safetensors' exists; export writes into a folder without")
relu = os.path.join(work, "hf_relu")
shutil.copytree(os.path.join(work, "hf_gelu"), relu)
config = json.load(open(os.path.join(relu, "config.json")))
config["activation_function"] = "relu"
json.dump(config, open(os.path.join(relu, "config.json"), "w"))
run("import", "--hf", relu, "--out", os.path.join(work, "run_relu"),
    expect_error='activation_function "relu" is neither')
run("import", "--hf", hub, "--out", os.path.join(work, "run_hub"),
    expect_error="exists and is not an empty folder")


def import_error(name, edit_config=None, edit_state=None, expect=""):
    # A copy of the gelu folder, its config.json or its tensors changed; the import must refuse.
    folder = os.path.join(work, "bad_" + name)
    shutil.copytree(os.path.join(work, "hf_gelu"), folder)
    if edit_config:
        config = json.load(open(os.path.join(folder, "config.json")))
        edit_config(config)
        json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    if edit_state:
        state = load_file(os.path.join(folder, "model.safetensors"))
        edit_state(state)
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    run("import", "--hf", folder, "--out", os.path.join(work, "run_bad_" + name), expect_error=expect)


import_error("llama", lambda c: c.update(model_type="llama"), expect='is not a GPT-2 (model_type "llama"')
import_error("eps", lambda c: c.update(layer_norm_epsilon=1e-6), expect="layer_norm_epsilon 1e-06")
import_error("untied", lambda c: c.update(tie_word_embeddings=False), expect="an untied head")
import_error("inner", lambda c: c.update(n_inner=100), expect="n_inner 100")
import_error("scaled", lambda c: c.update(scale_attn_by_inverse_layer_idx=True),
             expect="attention scaled otherwise")
import_error("missing", edit_state=lambda st: st.pop("transformer.h.1.mlp.c_fc.bias"),
             expect="has no tensor 'transformer.h.1.mlp.c_fc.bias'")
import_error("shape", edit_state=lambda st: st.update({"transformer.ln_f.bias": torch.zeros(31)}),
             expect="'transformer.ln_f.bias' has shape (31), not (32)")
import_error("head", edit_state=lambda st: st.update(
    {"lm_head.weight": st["transformer.wte.weight"] + 1}), expect="lm_head.weight differs from wte")
empty = os.path.join(work, "no_config")
os.makedirs(empty)
run("import", "--hf", empty, "--out", os.path.join(work, "run_none"),
    expect_error="cannot read '" + os.path.join(empty, "config.json") + "'")
rms_run = os.path.join(work, "fg_rms")
run("train", "configs/addition.yaml", "--set", "model.norm=rmsnorm", "--set", "train.steps=1",
    "--set", "train.device=cpu", "--set", f"train.out_dir={rms_run}")
run("export", rms_run, "--hf", os.path.join(work, "out_rms"), expect_error="a model with RMSNorm")
# eval --hellaswag reads text: a run of other token ids is refused.
hs = os.path.join(work, "hs.jsonl")
open(hs, "w").write('{"ctx": "a", "endings": ["b", "c"], "label": 0}\n')
run("eval", gpt2_run, "--hellaswag", hs, expect_error="--hellaswag reads text")
# A training run started into an imported run's folder is refused, so never takes it over.
run(*start, "--set", f"train.out_dir={os.path.join(work, 'run_hub')}",
    expect_error="which fusegrad did not write: a new run needs a new or empty directory")
print("GPT-2 weights in and out: transformers' logits within", TOL)
