#!/usr/bin/env bash
# One lent GPU, one call: `make gpu-check` (the correctness check: the GPU tier, the smoke run
# resumed, exported and evaluated, the demo's training) and then `benchmarks/gpu_step.py`
# (the speed figures: sampling, the learner, a GRPO step beside TRL's) in whatever the
# first leaves of one time budget. For a machine lent for minutes where each start costs
# minutes of its own: both issues' GPU figures come back from a single command.
#
# Usage (from anywhere: it runs in the checkout it belongs to):
#   bash benchmarks/gpu_session.sh           on the GPU machine, with .gpu/ carried along
#                                            (`WIDE=1 make gpu-wheels` where PyPI is reached:
#                                            the check's wheels and TRL's for gpu_step)
#   DEVICE=cpu bash benchmarks/gpu_session.sh
#                                            the dry run on a CPU: the check's dry run, then
#                                            gpu_step on its tiny shape
# Settings (environment): TOTAL, seconds for both (570: a 600 s call less the copying back);
# CHECK_BUDGET, the most the check may take (330; it ends its parts inside it and reports);
# what it leaves, less 10 s, is gpu_step's --budget (skipped under 90 s); OUT
# (runs/gpu-session): the check
# writes OUT/gpu-check/, gpu_step OUT/gpu-step/report.md (+ .json); STEP_ARGS, more options
# for gpu_step.py (e.g. "--decode compiled"); DEVICE, PY, WORK as gpu_check.sh takes them.
# Exit status: the check's (0: no step failed), or 1 when gpu_step's worker failed.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
T0=$(date +%s)
TOTAL=${TOTAL:-570}
CHECK_BUDGET=${CHECK_BUDGET:-330}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$ROOT/runs/gpu-session}
STEP_ARGS=${STEP_ARGS:-}
if [ "$CHECK_BUDGET" -ge "$TOTAL" ]; then
  echo "CHECK_BUDGET ($CHECK_BUDGET) must be less than TOTAL ($TOTAL)" >&2
  exit 2
fi
mkdir -p "$OUT"

echo "[gpu-session] part A: benchmarks/gpu_check.sh, budget ${CHECK_BUDGET}s"
OUT=$OUT/gpu-check BUDGET=$CHECK_BUDGET DEVICE=$DEVICE bash benchmarks/gpu_check.sh
check_rc=$?

# the python the check used (and installed into): the checkout's .venv, else python3
PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
left=$((T0 + TOTAL - $(date +%s) - 10))
step_rc=0
if [ "$check_rc" = 3 ]; then
  echo "[gpu-session] part B: skipped (torch or tracerl does not import: the check's exit 3)"
elif [ "$left" -lt 90 ]; then
  echo "[gpu-session] part B: skipped (${left}s of ${TOTAL}s left, needs 90)"
else
  shape=1.7b
  [ "$DEVICE" = cpu ] && shape=tiny
  echo "[gpu-session] part B: benchmarks/gpu_step.py --shape $shape, budget ${left}s"
  # shellcheck disable=SC2086  # STEP_ARGS: options, split on spaces
  JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$ROOT/src \
    "$PY" benchmarks/gpu_step.py --device "$DEVICE" --shape "$shape" --budget "$left" \
    --out "$OUT/gpu-step/report.md" $STEP_ARGS
  step_rc=$?
fi
echo "[gpu-session] done in $(($(date +%s) - T0))s: gpu-check exit $check_rc, gpu_step exit $step_rc"
echo "[gpu-session] reports: $OUT/gpu-check/report.md, $OUT/gpu-step/report.md"
[ "$check_rc" = 0 ] || exit "$check_rc"
exit "$step_rc"
