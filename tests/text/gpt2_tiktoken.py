"""tests/text/gpt2_tiktoken.py: tiktoken's GPT-2 encoding built from a local gpt2.tiktoken
(tiktoken's get_encoding("gpt2") would download it), for what compares fusegrad's tokenizer or its
text with tiktoken's: tests/text/tiktoken_parity.py, bench/bpe_speed.py and
bench/gpt2_text_proof.py. tiktoken comes from the environment or from build/tiktoken
(scripts/install_deps.sh --tests)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build",
                                "tiktoken"))
import tiktoken  # noqa: E402
from tiktoken.load import load_tiktoken_bpe  # noqa: E402

# GPT-2's pre-split pattern (the one text/gpt2_bpe.cpp compiles with PCRE2).
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def local_encoding(vocab_file):
    """GPT-2's encoding (50257 ids, <|endoftext|> = 50256) from the gpt2.tiktoken at vocab_file."""
    return tiktoken.Encoding(name="gpt2_local", pat_str=PATTERN,
                             mergeable_ranks=load_tiktoken_bpe(vocab_file),
                             special_tokens={"<|endoftext|>": 50256})
