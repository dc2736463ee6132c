"""tests/python/conftest.py: pytest set-up for the PyTorch package's tests.

`import fusegrad` finds the installed package (pip install .), else the source tree's
python/fusegrad, which then loads the library named by $FUSEGRAD_TORCH_LIBRARY (scripts/
test_python.sh builds build/cuda/capi/libfusegrad_torch.so and points it there). Tests marked `gpu` need a CUDA device and the
library; they are skipped without them, unless $FUSEGRAD_REQUIRE_GPU is set (the GPU machine's
script sets it), which turns a missing GPU or library into an error instead of a quiet skip.
"""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
try:
    import fusegrad  # noqa: F401
except ImportError as e:
    if "fusegrad" not in str(e) or "PyTorch" in str(e):
        raise
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import fusegrad  # noqa: F401


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and libfusegrad_torch.so")
    if os.environ.get("FUSEGRAD_REQUIRE_GPU") and not fusegrad.is_available():
        raise pytest.UsageError("FUSEGRAD_REQUIRE_GPU is set but the kernels cannot run: %s"
                                % fusegrad.why_unavailable())


def pytest_report_header(config):
    import torch
    where = os.path.dirname(fusegrad.__file__)
    why = fusegrad.why_unavailable()
    return ["fusegrad from %s; torch %s; kernels: %s" % (where, torch.__version__,
                                                         "available" if why is None else why)]


def pytest_collection_modifyitems(config, items):
    if fusegrad.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU and the library: %s" % fusegrad.why_unavailable())
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
