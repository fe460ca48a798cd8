"""pytest collection: the Triton kernels' modules import triton, which only the `gpu` extra
installs (`.ci/run` does); without it their doctests are skipped and tests/test_triton.py skips."""
import importlib.util

collect_ignore = [] if importlib.util.find_spec("triton") else ["rankkit/kernels/triton"]
