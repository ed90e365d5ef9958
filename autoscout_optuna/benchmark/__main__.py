"""``python -m autoscout_optuna.benchmark``: see :func:`autoscout_optuna.benchmark.main`."""

import sys

from autoscout_optuna.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
