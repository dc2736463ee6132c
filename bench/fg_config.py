"""bench/fg_config.py: a fusegrad config as fusegrad reads it, for the PyTorch scripts in bench/.

configs/*.yaml keep only the keys that differ from the defaults; `fusegrad config FILE --set ...`
prints every key, the file's and the overrides' values over the defaults, after fusegrad's own
checks. resolved_config() runs it and returns the result as a dict of sections. The binary is the
`fusegrad` argument, else $FUSEGRAD, else build-gpu/bin/fusegrad or build/cuda/bin/fusegrad.
"""
import os
import subprocess
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def resolved_config(path, overrides=(), fusegrad=None, who="bench"):
    """The config at `path` with every default filled in and `overrides` (KEY.PATH=VALUE) applied."""
    found = [b for b in (os.path.join(ROOT, "build-gpu", "bin", "fusegrad"),
                         os.path.join(ROOT, "build", "cuda", "bin", "fusegrad")) if os.access(b, os.X_OK)]
    given = fusegrad or os.environ.get("FUSEGRAD")
    if given and not (os.path.isfile(given) and os.access(given, os.X_OK)):
        sys.exit("%s: the fusegrad binary '%s' (--fusegrad or FUSEGRAD) is not an executable file"
                 % (who, given))
    fusegrad = given or (found[0] if found else None)
    if not fusegrad:
        sys.exit("%s: no fusegrad binary to resolve %s's defaults: build it, or pass --fusegrad BIN "
                 "(or set FUSEGRAD)" % (who, path))
    command = [fusegrad, "config", path] + [a for o in overrides for a in ("--set", o)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit("%s: `%s` failed: %s" % (who, " ".join(command), done.stderr.strip()))
    return yaml.safe_load(done.stdout)
