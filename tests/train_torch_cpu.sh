#!/usr/bin/env bash
# tests/train_torch_cpu.sh PYTHON FUSEGRAD: bench/train_torch.py, the PyTorch harness of the GPU
# comparisons, reads a config as fusegrad resolves it (configs/*.yaml keep only what differs from
# the defaults): two CPU steps of a tiny model, on characters and on random tokens, each with a
# finite loss at steps 1 and 2; and its two refusals: a --fusegrad that is no executable, and a
# key fusegrad does not know (fusegrad's own message passed on). Exit 77 (skipped) where PYTHON
# has no torch.
set -eu
python=$1 fusegrad=$2
"$python" -c "import torch, yaml" 2> /dev/null || exit 77
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tiny=(--set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.block_size=16
      --set train.batch_size=4 --set train.grad_accum=1)
for data in "configs/shakespeare_char.yaml --data tests/parity/corpus.txt" \
            "configs/gpt2_124m.yaml --set data.kind=random_tokens --set model.vocab_size=64"; do
    rm -rf "$work/run"
    # shellcheck disable=SC2086  # $data: a config and its flags, split on purpose
    "$python" bench/train_torch.py $data "$work/run" --device cpu --fusegrad "$fusegrad" \
        --steps 2 --eval-iters 1 "${tiny[@]}" > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    "$python" - "$work/run/metrics.jsonl" <<'PY'
import json, math, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if '"loss": ' in line]
if [s["step"] for s in steps] != [1, 2] or not all(math.isfinite(s["loss"]) for s in steps):
    sys.exit("want steps 1 and 2 with a finite loss, got %s" % steps)
PY
done
# refuses EXPECTED COMMAND...: COMMAND exits non-zero and its output contains EXPECTED.
refuses() {
    local expected=$1 output
    shift
    if output=$("$@" 2>&1); then echo "expected a refusal, got exit 0: $*"; exit 1; fi
    grep -qF -- "$expected" <<<"$output" || { echo "expected '$expected' in: $output"; exit 1; }
}
refuses "the fusegrad binary '$work/none' (--fusegrad or FUSEGRAD) is not an executable file" \
    "$python" bench/train_torch.py configs/addition.yaml "$work/run" --device cpu --fusegrad "$work/none"
refuses "train.nope: unknown key" \
    "$python" bench/train_torch.py configs/addition.yaml "$work/run" --device cpu --fusegrad "$fusegrad" \
    --set train.nope=1
