#!/usr/bin/env bash
# The wheels a lent GPU machine lacks (it has no package index), gathered here into .whl/ (ignored
# by git) for the device tool to carry (`carry: [".whl"]`); experiments/gpu_check.sh installs
# whatever .whl/ holds before its first step. The device image (Python 3.12) has torch, Triton,
# cuda-core, cuda-bindings and NVRTC (the shared-memory histogram's), PyYAML and Lightning; it lacks
# the CLI's jsonargparse and `rankkit tune`'s Optuna with alembic, SQLAlchemy, colorlog, Mako and
# greenlet, whose absence failed 125 of the suite's tests there on 2026-11-28. About 6 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
rm -rf .whl && mkdir -p .whl
for name in jsonargparse optuna alembic sqlalchemy colorlog mako greenlet; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d .whl "$name"
done
du -sh .whl
ls .whl
