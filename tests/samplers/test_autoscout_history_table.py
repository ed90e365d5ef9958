"""The model arm's table of the history: kept rows answer exactly what a rebuild would."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from autoscout_optuna.samplers._autoscout import history_table
from autoscout_optuna.samplers._autoscout.conditions import (
    ConditionEvidence,
    conditions_of,
    value_offsets,
)
from autoscout_optuna.samplers._autoscout.history_table import HistoryTable
from autoscout_optuna.samplers._autoscout.reader import Seen
from autoscout_optuna.samplers._autoscout.startup import infer_conditions
from autoscout_optuna.samplers._autoscout.surrogate import (
    ask_positions,
    encode,
    scored_grams,
    value_lookups,
)

NAMES = ["tp", "pp", "mode", "zero"]
VALUES = [[1, 2, 4, 8], [1, 2, 4, 8], ["none", "selective", "full"], [0, 1, 2, 3]]


def conditional_history(seed, n):
    # tp=8 never asks pp; pp=1 never asks mode; zero is asked nine times in ten
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        row = {"tp": int(rng.choice([1, 2, 4, 8]))}
        if row["tp"] != 8:
            row["pp"] = int(rng.choice([1, 2, 4, 8]))
        if row.get("pp", 1) != 1:
            row["mode"] = str(rng.choice(["none", "selective", "full"]))
        if rng.random() < 0.9:
            row["zero"] = int(rng.choice([0, 1, 2, 3]))
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed, n", [(0, 0), (1, 1), (2, 7), (3, 40), (4, 200)])
def test_conditions_from_codes_match_the_per_trial_reading(seed, n):
    rows = conditional_history(seed, n)
    codes = encode(NAMES, value_lookups(VALUES), rows)
    assert conditions_of(codes, NAMES, VALUES) == infer_conditions(rows, NAMES, of=NAMES)


def record(number, params, kind, score=None, reason=None, memory=None):
    key = tuple(sorted((k, repr(v)) for k, v in params.items()))
    attrs = {} if reason is None else {"failure_reason": reason}
    if memory is not None:
        attrs["memory_use"] = memory
    return Seen(number=number, params=params, distributions={}, kind=kind,
                score=score if kind in ("real", "estimate") else None,
                user_attrs=attrs, structure=key, config=key, arm="explore")


def rebuilt(history, value_lists=VALUES):
    """What a table that kept nothing reads: every record encoded afresh."""
    codes = encode(NAMES, value_lookups(value_lists), [obs.params for obs in history])
    scores = [np.nan if obs.score is None else obs.score for obs in history]
    return codes, [obs.kind for obs in history], scores, conditions_of(codes, NAMES,
                                                                       value_lists)


def assert_reads_as_rebuilt(table, history, value_lists=VALUES):
    inputs = table.read(history, NAMES, value_lists)
    codes, kinds, scores, conditions = rebuilt(history, value_lists)
    assert np.array_equal(inputs.codes, codes.reshape(len(history), len(NAMES)))
    assert list(inputs.kinds) == kinds
    assert np.array_equal(inputs.scores, np.asarray(scores, dtype=float), equal_nan=True)
    assert inputs.conditions == conditions
    # the kept gram plus the new rows' is, bit for bit, the gram of all rows
    assert np.array_equal(inputs.grams, scored_grams(codes, kinds, value_offsets(value_lists)))
    assert np.array_equal(inputs.positions, ask_positions(NAMES, [o.params for o in history]))
    broke = [o.kind == "failed" and o.user_attrs.get("failure_reason") == "invalid_layout"
             for o in history]
    assert list(inputs.broke_rule) == broke
    # a measured peak where a trial ran; infinite where it ran out of memory
    memory = [o.user_attrs.get("memory_use", np.nan) if o.kind == "real"
              else np.inf if o.kind == "failed" and o.user_attrs.get("failure_reason") == "oom"
              else np.nan for o in history]
    assert np.array_equal(inputs.memory, np.asarray(memory, dtype=float), equal_nan=True)


@pytest.mark.parametrize("seed", range(4))
def test_reads_while_trials_run_and_finish_match_a_rebuild(seed):
    rng = np.random.default_rng(seed)
    rows = conditional_history(seed, 60)
    table, history = HistoryTable(), []
    for number, params in enumerate(rows):
        kind = str(rng.choice(["real", "real", "estimate", "failed", "pending"]))
        reason = str(rng.choice(["oom", "invalid_layout"])) if kind == "failed" else None
        memory = float(rng.uniform(0.2, 1.0)) if rng.random() < 0.7 else None
        history.append(record(number, params, kind, float(rng.normal()), reason, memory))
        # now and then a running trial finishes: a new record replaces it in the middle
        running = [i for i, obs in enumerate(history) if obs.kind == "pending"]
        if running and rng.random() < 0.3:
            i = int(rng.choice(running))
            history[i] = record(i, history[i].params, "real", float(rng.normal()),
                                memory=float(rng.uniform(0.2, 1.0)))
        assert_reads_as_rebuilt(table, history)


def test_a_read_encodes_only_the_records_after_the_kept_ones(monkeypatch):
    encoded = []
    real_encode = history_table.encode

    def counting(names, lookups, rows):
        encoded.extend(rows)
        return real_encode(names, lookups, rows)

    monkeypatch.setattr(history_table, "encode", counting)
    rows = conditional_history(7, 50)
    history = [record(i, params, "real", float(i)) for i, params in enumerate(rows)]
    table = HistoryTable()
    table.read(history[:40], NAMES, VALUES)
    first = len(encoded)  # each distinct structure once
    assert first == len({obs.structure for obs in history[:40]})
    history.append(record(50, {"tp": 8, "zero": 1}, "pending"))
    assert_reads_as_rebuilt(table, history)
    # the 10 new finished records and the running one, no more (some structures repeat)
    assert first < len(encoded) <= first + 11


def test_other_value_lists_or_other_records_start_the_table_over():
    rows = conditional_history(3, 30)
    history = [record(i, params, "real", float(i)) for i, params in enumerate(rows)]
    table = HistoryTable()
    assert_reads_as_rebuilt(table, history)
    wider = [*VALUES[:3], [0, 1, 2, 3, 4]]
    assert_reads_as_rebuilt(table, history, wider)
    assert_reads_as_rebuilt(table, history)
    # a recreated study: the same trials as new records, and fewer of them
    again = [record(obs.number, obs.params, "failed") for obs in history[:12]]
    assert_reads_as_rebuilt(table, again)
    assert_reads_as_rebuilt(pickle.loads(pickle.dumps(table)), history)


@pytest.mark.parametrize("seed", range(3))
def test_condition_evidence_added_in_any_chunks_and_order_reads_as_one_pass(seed):
    rng = np.random.default_rng(seed)
    rows = conditional_history(seed, 80)
    codes = encode(NAMES, value_lookups(VALUES), rows)
    evidence = ConditionEvidence(value_offsets(VALUES))
    shuffled = codes[rng.permutation(len(codes))]
    for chunk in np.array_split(shuffled, 7):
        evidence.add(chunk)
    assert evidence.conditions(NAMES, VALUES) == conditions_of(codes, NAMES, VALUES)
    assert evidence.conditions(NAMES, VALUES)  # the history has conditional params
