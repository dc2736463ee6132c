#!/usr/bin/env bash
# tests/gpt2_text_proof_refusals.sh PYTHON SOURCE_DIR: bench/gpt2_text_proof.py refuses, naming
# what is wrong, before it runs anything: no nanoGPT checkout, no vocabulary file, and a work
# folder it did not make (never written into).
set -u
py=$1 src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/nanogpt" "$dir/theirs"
touch "$dir/nanogpt/train.py" "$dir/nanogpt/model.py" "$dir/nanogpt/configurator.py" "$dir/vocab"
echo "a user's file" > "$dir/theirs/notes.txt"
check="bash $(dirname "$0")/cli_expect_error.sh"
script=$src/bench/gpt2_text_proof.py
common="--fusegrad x --text x --out $dir/out"
status=0
$check "has no train.py: pass a nanoGPT checkout" "$py" "$script" $common --nanogpt "$dir" \
    --work "$dir/w" --vocab "$dir/vocab" || status=1
$check "no vocabulary at '$dir/missing'" "$py" "$script" $common --nanogpt "$dir/nanogpt" \
    --work "$dir/w" --vocab "$dir/missing" || status=1
$check "exists and is not this script's; give a new folder" "$py" "$script" $common \
    --nanogpt "$dir/nanogpt" --work "$dir/theirs" --vocab "$dir/vocab" || status=1
[ "$(ls "$dir/theirs")" = notes.txt ] || { echo "the user's folder was written into"; status=1; }
exit $status
