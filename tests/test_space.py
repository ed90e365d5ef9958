import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autoscout_optuna._space import (
    contains,
    discrete_values,
    from_unit,
    is_structural,
    n_levels,
    structure_key,
    to_unit,
)


@pytest.mark.parametrize(
    "dist, structural",
    [
        (CategoricalDistribution(["a", "b"]), True),
        (IntDistribution(1, 8), True),
        (IntDistribution(1, 64), False),
        (IntDistribution(0, 60, step=10), True),
        (FloatDistribution(0.0, 1.0), False),
        (FloatDistribution(0.0, 1.0, step=0.25), True),
        (FloatDistribution(0.0, 10.0, step=0.1), False),
        (IntDistribution(1, 1024, log=True), False),
    ],
)
def test_structural_classification(dist, structural):
    assert is_structural(dist) is structural


def test_levels_and_values_agree():
    for dist in [IntDistribution(0, 60, step=10), FloatDistribution(0.0, 1.0, step=0.25)]:
        assert len(discrete_values(dist)) == n_levels(dist)
    assert discrete_values(IntDistribution(0, 60, step=10)) == [0, 10, 20, 30, 40, 50, 60]
    with pytest.raises(ValueError, match="continuous"):
        discrete_values(FloatDistribution(0.0, 1.0))


def test_log_domain_is_linear_in_log_space():
    dist = FloatDistribution(1e-3, 1e3, log=True)
    assert to_unit(dist, 1.0) == pytest.approx(0.5)
    assert from_unit(dist, 0.5) == pytest.approx(1.0)


DISTS = [
    FloatDistribution(-3.0, 5.0),
    FloatDistribution(1e-6, 1.0, log=True),
    FloatDistribution(-10.2, 10.2, step=0.1),
    IntDistribution(1, 1000, log=True),
    IntDistribution(3, 99, step=3),
]


@given(u=st.floats(-0.5, 1.5, allow_nan=False), index=st.integers(0, len(DISTS) - 1))
def test_from_unit_always_lands_inside_the_domain(u, index):
    dist = DISTS[index]
    value = from_unit(dist, u)
    assert contains(dist, value)
    back = to_unit(dist, value)
    assert -1e-9 <= back <= 1 + 1e-9
    assert math.isfinite(back)


def test_categorical_has_no_unit_position():
    with pytest.raises(TypeError):
        to_unit(CategoricalDistribution(["a"]), "a")


def test_structure_key_names_the_structural_params_only_sorted_by_name():
    distributions = {"tp": CategoricalDistribution([1, 2]), "lr": FloatDistribution(0.0, 1.0),
                     "backend": CategoricalDistribution(["a", "b"]),
                     "sms": IntDistribution(1, 132)}
    params = {"tp": 2, "lr": 0.5, "backend": "a", "sms": 16}
    assert structure_key(params, distributions) == (("backend", "'a'"), ("tp", "2"))
    assert structure_key({**params, "lr": 0.1, "sms": 8}, distributions) == (
        structure_key(params, distributions))
