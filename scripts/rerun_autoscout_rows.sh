#!/usr/bin/env bash
# Re-run every committed benchmark row that runs our samplers (AutoScoutSampler, and with it
# FidelityPruner; MCTSSampler and CoordinateDescentSampler alone): what a change of their
# decisions moves. Baselines (TPE, GP, CMA-ES, random) keep their rows in the `autoscout` suites;
# the AutoScout and MCTS rows are merged into the suites' existing trials.csv under OUT (default
# benchmarks/results), held-out runs under OUT/held-out; the small `coordinate` and `mcts`
# suites are re-run whole (session 58 found both searchers' rows stale: no step covered them).
# Steps run in order and print their wall time; on 2 cores the whole takes about two hours
# (session 56: `fidelity-long` and its held-out seeds are two thirds of it).
#
# Usage: scripts/rerun_autoscout_rows.sh [OUT]
# Environment: PYTHON (default .venv/bin/python), QUICK=1 (tiny budgets into OUT, a smoke test
# of this script: nothing it writes is a result).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
OUT="${1:-benchmarks/results}"
QUICK_ARGS=()
if [[ "${QUICK:-}" == 1 ]]; then QUICK_ARGS=(--quick); fi

# The contenders of a suite that run our samplers: AutoScout itself, its ablations and
# variants (MCTSSampler alone among them), each also from the expert config.
autoscout_contenders() {
    "$PYTHON" - "$1" "${QUICK:-0}" <<'EOF'
import sys
from autoscout_optuna.benchmark.suites import autoscout
suites = autoscout.suites(quick=sys.argv[2] == "1")
suite = next(s for s in suites if s.name == sys.argv[1])
for c in suite.contenders:
    if c.name.startswith(("autoscout", "ablation:", "variant:")):
        print(c.name)
EOF
}

step() {
    local start=$SECONDS
    echo "== $(date -u +%H:%M:%S) $*"
    "$PYTHON" -m autoscout_optuna.benchmark "${QUICK_ARGS[@]}" "$@"
    echo "== done in $(( SECONDS - start )) s"
}

mapfile -t SHORT < <(autoscout_contenders autoscout)
mapfile -t LONG < <(autoscout_contenders autoscout-long)
step --suite autoscout --contender "${SHORT[@]}" --out "$OUT"
step --suite autoscout-long --contender "${LONG[@]}" --out "$OUT"
step --suite autoscout-overhead --out "$OUT"
step --suite fidelity --out "$OUT"         # every contender runs AutoScout
step --suite fidelity-long --out "$OUT"
step --suite coordinate --out "$OUT"      # CoordinateDescentSampler alone, and baselines
step --suite mcts --out "$OUT"            # MCTSSampler alone, and baselines
# held-out seeds, as committed: the defaults and the memory estimate on seeds 480-519, and
# fidelity-long on seeds 32-63
step --suite autoscout --first-seed 480 --seeds 40 \
    --contender autoscout "variant: memory estimate" --out "$OUT/held-out"
step --suite fidelity-long --first-seed 32 --seeds 32 --out "$OUT/held-out"
