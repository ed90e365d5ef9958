#!/usr/bin/env bash
# GPU check (`make gpu-check`): run the GPT-training study on this machine's GPU for at most
# 8 minutes and write benchmarks/gpu/results.csv and results.md.
#
# Meant for an image that has torch (with CUDA) but not optuna. Missing packages are installed
# from a LOCAL folder of wheels, never from the network (the repository holds no wheels).
# Prepare that folder on a machine with network access, for the image's Python version:
#
#   pip download -d wheels --only-binary=:all: --python-version 3.11 \
#       --platform manylinux2014_x86_64 optuna nvidia-ml-py numpy scipy
#
# Usage: scripts/gpu_check.sh [--wheels DIR] [--minutes N] [--time-budget S] [--out DIR]
#                             [--dry-run]
#   --wheels DIR   folder of wheels (or set AUTOSCOUT_WHEELS); needed only if packages are missing
#   --dry-run      CPU smoke test of the script itself (tiny budget, no GPU needed)
# Environment: PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
WHEELS="${AUTOSCOUT_WHEELS:-}"
MINUTES=8
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --minutes) MINUTES="$2"; shift 2 ;;
    --time-budget|--out|--device|--seed|--log-dir) EXTRA+=("$1" "$2"); shift 2 ;;
    --dry-run) EXTRA+=("--dry-run"); shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
if awk "BEGIN {exit !($MINUTES > 8)}"; then
  echo "gpu_check: --minutes $MINUTES is over the 8-minute cap" >&2; exit 2
fi

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "gpu_check: $PYTHON cannot import torch; this check runs on an image that has it" >&2
  exit 2
fi

# Modules the study needs, and the distribution that provides each.
missing=$("$PYTHON" - <<'PY'
import importlib.util
needed = {"optuna": "optuna", "numpy": "numpy", "scipy": "scipy", "pynvml": "nvidia-ml-py"}
print(" ".join(dist for mod, dist in needed.items() if importlib.util.find_spec(mod) is None))
PY
)
if [[ -n "$missing" ]]; then
  if [[ -z "$WHEELS" || ! -d "$WHEELS" ]]; then
    echo "gpu_check: missing packages: $missing" >&2
    echo "gpu_check: pass --wheels DIR, a folder prepared with 'pip download' (see the header)" >&2
    exit 2
  fi
  echo "gpu_check: installing $missing from $WHEELS (no network)"
  "$PYTHON" -m pip install --no-index --find-links "$WHEELS" $missing
fi

echo "gpu_check: $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")')"
# The hard cap: the Python side stops starting trials in time; timeout is the backstop.
# --foreground: without it timeout moves into a process group of its own, so Ctrl-C on
# `make gpu-check` (make's group) never reached the check, which ran on to the cap.
# The trainer runs in its own session either way; gpu_check.py kills it on SIGTERM/SIGINT.
CAP_S=$(awk "BEGIN {print int($MINUTES * 60 + 30)}")
exec timeout --foreground --kill-after=20 "$CAP_S" \
  "$PYTHON" scripts/gpu_check.py --minutes "$MINUTES" "${EXTRA[@]}"
