"""Randomness that survives a restart.

A running RNG inside a sampler is state that storage cannot rebuild: after a resume it would be
in a different place. Every random choice here is drawn from a generator derived from
(seed, trial number, purpose), as Optuna's Hyperband does with its bracket hash.
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
