#!/usr/bin/env bash
# What the GPU machine runs for a session's results: build xlakern, then one stage.
#   bash tools/gpu_session.sh tests    # every test (GPU ones included), log in $OUT ($PYTEST_WORKERS, default 6)
#   bash tools/gpu_session.sh bench    # the bench scripts' tables, in $OUT
#   bash tools/gpu_session.sh multi    # the multi-GPU network bench and tests
# Wheels in .whl/ (BrainEvent 0.3.0, brainstate and their pure-Python needs) go on PYTHONPATH.
set -uo pipefail
BENCH_ARGS=${BENCH_ARGS:-}
export PYTHONUNBUFFERED=1 XLAKERN_QUIET=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
nvidia-smi -L
case "${1:-tests}" in
  tests)
    # Several workers share the GPU: no worker may preallocate most of its memory.
    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -rs -n ${PYTEST_WORKERS:-6} -p no:cacheprovider tests ${2:-} \
      2>&1 | tee "$OUT/pytest.log" | tail -40 ;;
  bench)
    for b in ${2:-bench_zeroed bench_event bench_build}; do
      echo "== $b"; timeout ${BENCH_TIMEOUT:-300} python3 bench/$b.py $BENCH_ARGS > "$OUT/$b.md" 2> "$OUT/$b.err"; tail -60 "$OUT/$b.md"
    done ;;
  network)
    python3 bench/bench_network.py ${2:-} --json "$OUT/network.json" --plot "$OUT/rtf_vs_n.png" \
      2> "$OUT/network.err" | tee "$OUT/network.md" ;;
esac
