"""pytest collection: the Triton kernels' modules import triton, which only the `gpu` extra
installs (`.ci/run` does); without it their doctests are skipped and
tests/kernels/triton/test_triton.py skips.

``RANKKIT_FAILURES=path``: each failing test's id and last error line is appended to ``path`` as
it fails, so a run cut off by a time limit (a lent GPU machine's) still names its failures."""
import importlib.util
import os

collect_ignore = [] if importlib.util.find_spec("triton") else ["rankkit/kernels/triton"]


def pytest_runtest_logreport(report):
    path = os.environ.get("RANKKIT_FAILURES")
    if path and report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash else (str(report.longrepr).strip().splitlines() or [""])[-1]
        with open(path, "a") as f:
            f.write(f"{report.nodeid} ({report.when}): {' '.join(message.split())[:300]}\n")
