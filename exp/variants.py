"""Variants: name -> dict(make_pruner=..., ensemble=...)."""
from __future__ import annotations

import functools


def pruner(seed, **kw):
    from autoscout_optuna import FidelityPruner
    return FidelityPruner(**kw)


VARIANTS = {
    "base": {},
    "pscale": {"make_pruner": functools.partial(pruner, selection_aware=True)},
    "ens": {"ensemble": {"selection_aware": True}},
    "both": {"make_pruner": functools.partial(pruner, selection_aware=True),
             "ensemble": {"selection_aware": True}},
}
VARIANTS["did"] = {"make_pruner": functools.partial(pruner, new_structure_control=True)}
VARIANTS["both_did"] = {"make_pruner": functools.partial(pruner, selection_aware=True, new_structure_control=True),
                        "ensemble": {"selection_aware": True}}
for _p in (0.05, 0.1, 0.2, 0.3):
    VARIANTS[f"both_p{_p}"] = {"make_pruner": functools.partial(pruner, selection_aware=True, promotion_probability=_p),
                               "ensemble": {"selection_aware": True}}
    VARIANTS[f"base_p{_p}"] = {"make_pruner": functools.partial(pruner, promotion_probability=_p)}


def blind_sampler(seed, factor=0.02):
    import autoscout_optuna.samplers._mcts.sampler as m
    import autoscout_optuna.samplers._autoscout.sampler as a
    from autoscout_optuna import _history
    orig = _history.estimate_reliability
    m.estimate_reliability = lambda study: factor * orig(study) if factor < 1 else orig(study)
    a.estimate_reliability = m.estimate_reliability
    from autoscout_optuna import AutoScoutSampler
    return AutoScoutSampler(seed=seed)


VARIANTS["blind"] = {"make_sampler": blind_sampler}
VARIANTS["blind_both_did"] = dict(VARIANTS["both_did"], make_sampler=blind_sampler)


def ivw_sampler(seed):
    """Reliability times min(1, (MEASUREMENT_GRADE_ERROR / relative_error)^2)."""
    import math
    import autoscout_optuna.samplers._mcts.sampler as m
    import autoscout_optuna.samplers._autoscout.sampler as a
    from autoscout_optuna import _history
    orig = _history.estimate_reliability

    def rel(study):
        base = orig(study)
        check = _history.latest_rank_check(study)
        err = None if check is None else check.get("relative_error")
        if isinstance(err, (int, float)) and math.isfinite(err) and err > 0:
            base *= min(1.0, (_history.MEASUREMENT_GRADE_ERROR / err) ** 2)
        return max(base, _history.MIN_RELIABILITY * 0.1)
    m.estimate_reliability = rel
    a.estimate_reliability = rel
    from autoscout_optuna import AutoScoutSampler
    return AutoScoutSampler(seed=seed)


VARIANTS["ivw"] = {"make_sampler": ivw_sampler}
VARIANTS["ivw_both_did"] = dict(VARIANTS["both_did"], make_sampler=ivw_sampler)


def ledger_sampler(seed):
    import autoscout_optuna.samplers._autoscout.did as did
    did.REAL_OVER_ESTIMATE = True
    from autoscout_optuna import AutoScoutSampler
    return AutoScoutSampler(seed=seed)


VARIANTS["ledger"] = {"make_sampler": ledger_sampler}
VARIANTS["ledger_both_did"] = dict(VARIANTS["both_did"], make_sampler=ledger_sampler)
VARIANTS["gated"] = dict(VARIANTS["ledger_both_did"])
VARIANTS["grade"] = dict(VARIANTS["ledger_both_did"])
VARIANTS["grade_only"] = {}
