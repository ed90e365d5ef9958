"""Randomness that survives a restart.

A running RNG inside a sampler is state that storage cannot rebuild: after a resume it would be
in a different place. Every random choice here is drawn from a generator derived from
(seed, trial number, purpose), as Optuna's Hyperband does with its bracket hash.

So the samplers keep their seed when Optuna calls ``reseed_rng`` (it does when
``optimize(n_jobs > 1)`` starts its threads, so that copies of one running RNG do not repeat
each other's draws): draws keyed by trial number already differ per trial, and a fresh seed
would only throw away the user's (Optuna's ``QMCSampler`` keeps its seed for the same
reason). They forward the call to the Optuna samplers they hold, whose RNGs do run.
"""

from __future__ import annotations

import hashlib

import numpy as np


def resolve_seed(seed: int | None) -> int:
    """A concrete seed: ``seed`` itself, or a fresh random one when ``seed`` is None."""
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    return int(seed)


def trial_rng(seed: int, trial_number: int, purpose: str) -> np.random.Generator:
    """A generator that is a pure function of (seed, trial number, purpose)."""
    digest = hashlib.blake2b(purpose.encode(), digest_size=8).digest()
    salt = int.from_bytes(digest, "little")
    return np.random.default_rng([seed % (2**63), int(trial_number), salt])
