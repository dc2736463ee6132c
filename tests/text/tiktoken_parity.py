#!/usr/bin/env python3
"""tests/text/tiktoken_parity.py: fusegrad's GPT-2 tokenizer against tiktoken's, id for id.

tiktoken (pip, in build/tiktoken: scripts/install_deps.sh --tests) is given an Encoding built
from the same local gpt2.tiktoken (tiktoken's get_encoding("gpt2") would download). Texts: the
hand-written torture text (tests/text/torture.txt), seeded random strings drawn from many Unicode
blocks and whitespace, any files named on the command line (the Shakespeare text, where it
exists), and bytes that are not valid UTF-8 (the torture text with invalid bytes put in, random
bytes) against tiktoken's encoding of bytes. Each is encoded by tests/text/fg_bpe_dump and by tiktoken's encode_ordinary; the first
difference is printed with its context. "Hello world" must be 15496 995.

usage: tiktoken_parity.py FG_BPE_DUMP VOCAB_FILE [TEXT_FILE...]
"""
import os
import random
import subprocess
import sys
import tempfile

from gpt2_tiktoken import local_encoding  # tests/text/gpt2_tiktoken.py, beside this file


def ours(dump, text):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
    try:
        out = subprocess.run([dump, f.name], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    return [int(t) for t in out.split()]


def random_text(rng, n):
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
              (0x1F300, 0x1F64F), (0x300, 0x36F), (0x2000, 0x206F)]
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            out.append(rng.choice([" ", "  ", "\n", "\t", "\r\n", "   ", "\u00a0", "'s", "'ll"]))
        else:
            lo, hi = rng.choice(blocks)
            c = rng.randint(lo, hi)
            if 0xD800 <= c <= 0xDFFF:
                continue
            out.append(chr(c))
    return "".join(out)


def main():
    dump, vocab, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    enc = local_encoding(vocab)
    here = os.path.dirname(os.path.abspath(__file__))
    texts = [("Hello world", "Hello world")]
    texts.append(("torture.txt", open(os.path.join(here, "torture.txt"), encoding="utf-8",
                                      newline="").read()))
    rng = random.Random(1234)
    for i in range(20):
        texts.append(("random %d" % i, random_text(rng, rng.randint(1, 3000))))
    for path in files:
        texts.append((path, open(path, encoding="utf-8", newline="").read()))
    # Bytes that are not valid UTF-8, compared with tiktoken's encoding of bytes (_encode_bytes):
    # the torture text with invalid bytes put in, and random bytes.
    torture = texts[1][1].encode("utf-8")
    bad = [b"\x80", b"\xff\xfe", b"\xe2\x82", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf0\x9f"]
    for i in range(10):
        at = sorted(rng.randrange(len(torture)) for _ in range(3))
        b = torture
        for k in reversed(at):
            b = b[:k] + rng.choice(bad) + b[k:]
        texts.append(("torture with invalid bytes %d" % i, b))
    for i in range(20):
        texts.append(("random bytes %d" % i, bytes(rng.randrange(256) for _ in range(rng.randint(1, 600)))))
    failed = 0
    total = 0
    for name, text in texts:
        a = ours(dump, text)
        b = enc._encode_bytes(text) if isinstance(text, bytes) else enc.encode_ordinary(text)
        total += len(b)
        if a != b:
            failed += 1
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print("%s: differs at id %d: fusegrad %s, tiktoken %s (bytes around: %r)" % (
                name, i, a[max(0, i - 3):i + 3], b[max(0, i - 3):i + 3],
                enc.decode_bytes(b[max(0, i - 3):i + 3])))
    if ours(dump, "Hello world") != [15496, 995]:
        print("Hello world is not 15496 995")
        failed += 1
    if failed:
        sys.exit(1)
    print("tiktoken parity: %d texts, %d ids, all identical" % (len(texts), total))


if __name__ == "__main__":
    main()
