#!/usr/bin/env bash
# Wheels the H200 device machine lacks (its image has torch, transformers, pandas, click, numpy, einops), for
# Python 3.12 x86-64, into .whl/ (ignored: `echo /.whl/ >> .git/info/exclude`): nvtx (the runtime's ranges),
# fla-core (gated delta rule kernels), msgspec (gaptrace's loader: the benchmarks read their captures),
# plotly + narwhals (gaptrace report). A device call then carries [".whl"] and starts with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-deps --no-build-isolation \
#     --no-index -e .
set -eu
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  nvtx==0.2.17 fla-core==0.6.0 msgspec==0.23.0 plotly==7.1.0 narwhals==2.29.0
ls -l .whl
