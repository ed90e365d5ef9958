"""Whether the model arm may look at an estimated configuration again (``relook.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from autoscout_optuna import _keys
from autoscout_optuna.samplers._autoscout.reader import Seen
from autoscout_optuna.samplers._autoscout.relook import (
    exact_repeats,
    graded_estimates,
    settling_estimates,
    simulator_varies,
)

DENSE = ("bucket_mb",)


def seen(number, params, kind, score, simulated=None, detail=None):
    key = tuple(sorted((k, repr(v)) for k, v in params.items()))
    attrs = {} if simulated is None else {_keys.SIMULATED: simulated}
    if detail is not None:
        attrs[_keys.SIM_ERROR_DETAIL] = detail
    structure = tuple(item for item in key if item[0] not in DENSE)
    return Seen(number=number, params=params, distributions={}, kind=kind, score=score,
                user_attrs=attrs, structure=structure, config=key, arm="model")


A = {"tp": 2, "bucket_mb": 40.0}
B = {"tp": 4, "bucket_mb": 40.0}
A_OTHER_DENSE = {"tp": 2, "bucket_mb": 80.0}


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        # no configuration estimated twice: not known yet
        ([seen(0, A, "estimate", 1.0), seen(1, B, "estimate", 2.0)], None),
        # the same configuration, the same estimate: a repeating simulator
        ([seen(0, A, "estimate", 1.0), seen(1, A, "estimate", 1.0)], False),
        ([seen(0, A, "estimate", 1.0), seen(1, A, "estimate", 1.3)], True),
        # the raw simulator value decides where recorded: an ensemble refitted between the
        # looks moves the estimate of a repeating simulator
        ([seen(0, A, "estimate", 1.0, simulated=5.0), seen(1, A, "estimate", 1.3, simulated=5.0)],
         False),
        # a real run's recorded simulator value is a look too; its real score is not
        ([seen(0, A, "real", 9.0, simulated=5.0), seen(1, A, "estimate", 4.0, simulated=4.0)],
         True),
        ([seen(0, A, "real", 9.0), seen(1, A, "estimate", 4.0)], None),
        # one configuration that varied is enough, whatever the others did
        ([seen(0, B, "estimate", 2.0), seen(1, B, "estimate", 2.0), seen(2, A, "estimate", 1.0),
          seen(3, A, "estimate", 1.1)], True),
        # no estimate at all (no pruner): nothing to say
        ([seen(0, A, "real", 9.0), seen(1, A, "real", 9.5)], None),
        ([seen(0, A, "estimate", float("nan")), seen(1, A, "estimate", 1.0)], None),
    ],
)
def test_whether_the_simulator_varies_is_read_from_repeated_configurations(history, expected):
    assert simulator_varies(history) is expected


def test_exact_repeats_mark_the_estimates_with_the_trials_dense_values_of_a_repeating_simulator():
    history = [seen(0, A, "estimate", 1.0), seen(1, A, "estimate", 1.0),
               seen(2, A_OTHER_DENSE, "estimate", 0.8), seen(3, B, "real", 2.0)]
    mask = exact_repeats(history, {"bucket_mb": 40.0}, DENSE)
    # a real run is no estimate; an estimate with other dense values is another configuration
    assert mask.tolist() == [True, True, False, False]


def test_a_simulator_that_varies_or_is_not_known_yet_leaves_every_estimate_open():
    varying = [seen(0, A, "estimate", 1.0), seen(1, A, "estimate", 1.2)]
    unknown = [seen(0, A, "estimate", 1.0)]
    for history in (varying, unknown):
        assert exact_repeats(history, {"bucket_mb": 40.0}, DENSE) is None
    assert isinstance(exact_repeats(varying[:1] * 2, {"bucket_mb": 40.0}, DENSE), np.ndarray)


# the pruner's error check on a trial (``autoscout:sim_error_detail``): measurement grade is a
# calibrated relative error of at most 5 % and a rank discordance of at most 0.25
EXACT = {"relative_error": 0.02, "discordance": 0.1}
NOISY = {"relative_error": 0.12, "discordance": 0.1}
MISORDERED = {"relative_error": 0.02, "discordance": 0.4}


def test_only_estimates_the_pruner_judged_measurement_grade_are_graded():
    history = [seen(0, A, "estimate", 1.0, detail=EXACT), seen(1, A, "estimate", 1.0, detail=NOISY),
               seen(2, B, "estimate", 2.0, detail=MISORDERED), seen(3, B, "estimate", 2.0),
               seen(4, B, "real", 2.0, detail=EXACT), seen(5, B, "failed", None, detail=EXACT)]
    assert graded_estimates(history).tolist() == [True, False, False, False, False, False]


def test_settling_estimates_are_the_graded_ones_and_for_a_repeating_simulator_the_exact_repeats():
    history = [seen(0, A, "estimate", 1.0, detail=NOISY), seen(1, A, "estimate", 1.0, detail=NOISY),
               seen(2, A_OTHER_DENSE, "estimate", 0.8, detail=EXACT),
               seen(3, B, "estimate", 2.0, detail=NOISY)]
    dense = {"bucket_mb": 40.0}
    # the simulator repeated itself on A: every estimate with the trial's dense values settles
    # (B's too), and the graded one with other dense values
    assert settling_estimates(history, dense, DENSE).tolist() == [True, True, True, True]
    assert settling_estimates(history, {"bucket_mb": 10.0}, DENSE).tolist() == [
        False, False, True, False]
    # no dense values known: only the graded estimate settles
    assert settling_estimates(history, None, DENSE).tolist() == [False, False, True, False]
    varying = [*history[:1], seen(1, A, "estimate", 1.3, detail=NOISY), *history[2:]]
    assert settling_estimates(varying, dense, DENSE).tolist() == [False, False, True, False]
