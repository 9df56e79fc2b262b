#!/usr/bin/env bash
# The wheels a GPU machine's Python 3.12 lacks for benchmarks/gpu_acceptance.py (pydantic and its parts; the
# GPU image has torch, torchvision, numpy, PyYAML, scikit-learn and tqdm), fetched here into .whl/ (ignored
# by git) at the versions this checkout's environment runs. On the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
# One version of each: pip refuses to install two wheels of one package, so an older fetch goes first.
rm -f .whl/pydantic-*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    "pydantic==$(version pydantic)" "pydantic-core==$(version pydantic-core)" \
    "annotated-types==$(version annotated-types)" "typing-inspection==$(version typing-inspection)"
ls .whl
