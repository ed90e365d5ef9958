"""The orchestrator's history reader: a memo of finished trials must read like a fresh one."""

from typing import Any

import optuna
from optuna.trial import TrialState

from autoscout_optuna.samplers._autoscout.reader import HistoryReader


def _summary(history):
    return [(s.number, s.kind, s.score, dict(s.gains)) for s in history]


def _ask(study):
    trial = study.ask()
    trial.suggest_categorical("layout", ["a", "b"])
    trial.suggest_float("x", 0.0, 1.0)
    return trial


def test_the_settled_prefix_reads_like_a_walk_over_every_trial():
    # Trials finish out of order (some stay running across reads), so the prefix of finished
    # trials stops and grows again; a reader that forgets its prefix before every read walks
    # every trial through the memo, as the reader did before it kept a prefix.
    study = optuna.create_study(direction="minimize")
    kept, walked = HistoryReader(), HistoryReader()
    running = []
    for i in range(16):
        trial = _ask(study)
        if i % 4 == 1:
            running.append(trial)
        elif i % 4 == 2:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, float(i % 5))
        if i % 3 == 0 and running:
            study.tell(running.pop(0), 0.5)
        current = study.trials[-1] if i % 2 else None
        walked._prefixes.clear()
        expected = _summary(walked.read(study, exclude=current)[0])
        history, _, pending = kept.read_with_pending(study, exclude=current)
        assert _summary(history) == expected
        # the running trials, found past the settled prefix, are every pending record
        assert pending == [s for s in history if s.kind == "pending"]
        assert [n for n, *_ in expected] == [
            t.number for t in study.trials if current is None or t.number != current.number
        ]
    assert kept._prefixes[study.study_name][0] < len(study.trials)  # running ones remain


def _read_then_recreated(reader: HistoryReader, **create: Any) -> optuna.Study:
    """A study of three trials that ``reader`` has read, deleted and created again under its
    name in the same storage (``create``: the new study's other arguments)."""
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="s")
    for value in (3.0, 2.0, 1.0):
        study.tell(_ask(study), value)
    assert len(reader.read(study)[0]) == 3
    optuna.delete_study(study_name="s", storage=storage)
    return optuna.create_study(storage=storage, study_name="s", **create)


def test_a_study_recreated_under_the_same_name_is_read_afresh():
    reader = HistoryReader()
    study = _read_then_recreated(reader, direction="maximize")
    study.tell(_ask(study), 7.0)
    history, digest = reader.read(study)
    assert _summary(history) == _summary(HistoryReader().read(study)[0])
    assert [s.score for s in history] == [7.0] and digest.scores == [7.0]


def test_the_digest_noise_pools_every_repeated_config_in_the_order_first_measured():
    import random

    from autoscout_optuna.samplers._autoscout.did import pooled_noise
    from autoscout_optuna.samplers._autoscout.reader import Seen, StudyDigest

    rng = random.Random(0)
    digest = StudyDigest()
    for number in range(300):
        config = (("x", repr(rng.randrange(60))),)
        score = rng.gauss(0.0, 1.0) * 1e3
        seen = Seen(number=number, params={}, distributions={}, kind="real", score=score,
                    user_attrs={}, structure=(), config=config, arm="refine")
        digest.add(seen)
        if number % 7 == 0:
            expected = pooled_noise([v for v in digest.repeats.values() if len(v) > 1])
            assert digest.noise() == expected  # the same sum, in the same order: bit for bit


def test_the_digest_scale_follows_every_new_score():
    from autoscout_optuna.samplers._autoscout.did import score_scale
    from autoscout_optuna.samplers._autoscout.reader import Seen, StudyDigest

    digest = StudyDigest()
    assert digest.scale() == score_scale([])
    for number, (kind, score) in enumerate([("real", 3.0), ("failed", None), ("real", 5.0),
                                            ("estimate", 4.0), ("real", float("inf")),
                                            ("real", 9.0), ("real", 4.0), ("real", -2.0)]):
        digest.add(Seen(number=number, params={}, distributions={}, kind=kind, score=score,
                        user_attrs={}, structure=(), config=(), arm="explore"))
        assert digest.scale() == score_scale(digest.scores)
    assert digest.scale() != score_scale([3.0, 5.0])  # it moved with the later scores


def test_the_first_trial_of_a_recreated_study_sees_an_empty_history():
    # Read with its own (running) trial excluded, trial 0 of the new study leaves no other
    # trial whose start time could reveal the old study: the digest must not be the old one's.
    reader = HistoryReader()
    study = _read_then_recreated(reader)
    first = study.ask()
    history, digest = reader.read(study, exclude=study.trials[first.number])
    assert history == [] and digest.scores == [] and digest.incumbent() is None
