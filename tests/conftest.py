import os

import optuna
import pytest

optuna.logging.set_verbosity(optuna.logging.WARNING)


def pytest_collection_modifyitems(config, items):
    """gpu tests skip without CUDA; postgres tests skip without a server URL (reason shown)."""
    has_cuda = False
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        pass
    pg_url = os.environ.get("AUTOSCOUT_TEST_POSTGRES_URL")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU on this machine"))
        if "postgres" in item.keywords and not pg_url:
            item.add_marker(
                pytest.mark.skip(reason="AUTOSCOUT_TEST_POSTGRES_URL not set (.ci/run sets it)")
            )
