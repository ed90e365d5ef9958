#!/usr/bin/env bash
# One short GPU lease, end to end (about 9 minutes): the product as a user runs it on a GPU.
#
#   1. installs what the image lacks from a local folder of wheels (never the network) and this
#      checkout (editable, no dependencies);
#   2. runs the GPU tests (`pytest -m gpu`: a real trial with NVML telemetry, every attention
#      backend the device offers, a real CUDA out-of-memory recorded as `oom`);
#   3. runs TWO `autoscout run gpt_training` workers at once on one SQLite study and one GPU:
#      AutoScoutSampler + FidelityPruner, the GPU lock queueing the real runs;
#   4. writes the study's tables (scripts/gpu_check.py --summarize) to OUT_DIR.
#
# Usage: scripts/gpu_session.sh [OUT_DIR] (default benchmarks/gpu/session)
# Environment: PYTHON (python3), WHEELS (.whl), WORKER_S (seconds the workers start trials,
# default 270), BUDGET_S (training seconds per trial, 20), RUN_TIMEOUT_S (kill a run after, 90),
# GPU_TESTS_S (cap on the GPU tests, 240; 0 skips them),
# DRY_RUN=1 (CPU rehearsal: device cpu, tiny budgets, no GPU tests: WORKER_S 40, BUDGET_S 2,
# RUN_TIMEOUT_S 30 unless set).
# Exit status: 0 when the GPU tests, both workers and the summary all succeeded, else 1 (the
# session still runs every step and writes its tables).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-benchmarks/gpu/session}"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-.whl}"
DEVICE=cuda
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  DEVICE=cpu
  WORKER_S="${WORKER_S:-40}"
  BUDGET_S="${BUDGET_S:-2}"
  RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-30}"
fi
WORKER_S="${WORKER_S:-270}"
BUDGET_S="${BUDGET_S:-20}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-90}"
status=0  # 1 once any step failed
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/session.log"
: >"$LOG"
say() { echo "gpu_session: $*" | tee -a "$LOG"; }
# Ctrl-C or SIGTERM: stop the workers too. Each runs under `timeout`, in a process group of its
# own, and a background command of a script ignores SIGINT: left alone they ran on to WORKER_S,
# holding the GPU. timeout passes SIGTERM on; the worker then kills its job (`autoscout run`).
pids=()
stop_workers() {
  trap - INT TERM
  say "interrupted: stopping the workers"
  [[ ${#pids[@]} -gt 0 ]] && kill -TERM "${pids[@]}" 2>/dev/null
  wait
  exit 130
}
trap stop_workers INT TERM

if ! "$PYTHON" -c "import optuna, optuna_dashboard" 2>/dev/null; then
  say "installing optuna and optuna-dashboard from $WHEELS"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl || exit 2
fi
if ! "$PYTHON" -c "import autoscout_optuna.studies" 2>/dev/null; then
  say "installing this checkout (editable, no dependencies)"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
fi
say "$("$PYTHON" -c 'import torch, optuna; print("torch", torch.__version__, "optuna", optuna.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")')"

if [[ "$DEVICE" == cuda && "${GPU_TESTS_S:-240}" != 0 ]]; then
  say "GPU tests"
  timeout --foreground "${GPU_TESTS_S:-240}" "$PYTHON" -m pytest -q -ra -m gpu -p no:cacheprovider \
    tests/studies/test_gpt_training_gpu.py 2>&1 | tee -a "$LOG" | tail -15
  tests_exit=${PIPESTATUS[0]}
  say "GPU tests exit $tests_exit"
  [[ "$tests_exit" == 0 ]] || status=1
fi

DB="$OUT_DIR/study.db"
rm -f "$DB"
say "two workers on one study and one device for ${WORKER_S}s"
for seed in 1 2; do
  timeout --kill-after=20 $((WORKER_S + RUN_TIMEOUT_S + 60)) \
    "$PYTHON" -m autoscout_optuna.cli run gpt_training --storage "sqlite:///$DB" --seed "$seed" --n-trials 200 \
    --timeout "$WORKER_S" -o device="$DEVICE" -o time_budget="$BUDGET_S" \
    -o timeout="$RUN_TIMEOUT_S" -o log_dir="$OUT_DIR/logs" \
    --artifact-dir "$OUT_DIR/artifacts" >"$OUT_DIR/worker$seed.log" 2>&1 &
  pids+=($!)
  # the second worker joins once the first has created the study and claimed the default
  # config's measurement (two processes creating one SQLite schema at the same instant can
  # collide; joining a running study is the norm)
  for _ in $(seq 120); do
    kill -0 "${pids[-1]}" 2>/dev/null || break  # it died: nothing will claim, stop waiting
    "$PYTHON" -c "import optuna, sys; s = optuna.load_study(study_name='gpt_training', storage='sqlite:///$DB'); sys.exit('autoscout:default_claim' not in s.user_attrs)" \
      2>/dev/null && break
    sleep 0.5
  done
done
for pid in "${pids[@]}"; do
  wait "$pid"
  worker_exit=$?
  say "worker $pid exit $worker_exit"
  [[ "$worker_exit" == 0 ]] || status=1
done
tail -25 "$OUT_DIR/worker1.log" | tee -a "$LOG"
"$PYTHON" scripts/gpu_check.py --summarize "sqlite:///$DB" --out "$OUT_DIR" 2>&1 | tee -a "$LOG" \
  || status=1
say "exit $status"
exit "$status"
