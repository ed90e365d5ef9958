"""Training text every machine already has: the Python standard library's own source.

Bytes are the tokens (vocabulary 256), so the model's cross-entropy in bits is exactly bits per
byte and needs no tokenizer download. The split is by file, decided by a hash of the file name,
so it is the same on every run of the same Python installation and no file leaks into both.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VAL_EVERY = 10  # about one file in ten goes to validation
MAX_CORPUS_BYTES = 16 * 2**20  # bound on memory and start-up time for very large --data files
MIN_DATA_BYTES = 4096  # a user's text file must have this much to split into train and val


@dataclass(frozen=True)
class Corpus:
    """A byte corpus split into train and validation arrays of ``uint8``.

    Attributes:
        train: Training bytes.
        val: Validation bytes.
        source: Where the text came from (a directory or a file path).
        digest: Short hash of the whole text, so results name the exact data they used.
    """

    train: np.ndarray
    val: np.ndarray
    source: str
    digest: str


def stdlib_files() -> list[Path]:
    """The top-level ``*.py`` modules of the running Python's standard library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.glob("*.py"))


def _goes_to_val(name: str) -> bool:
    digest = hashlib.blake2b(name.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % VAL_EVERY == 0


def check_data_file(path: str | Path) -> None:
    """Raise a ValueError where :func:`load_corpus` would refuse the text file ``path``:
    missing, or too small to split (the study checks it before any run is spent)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"data file {str(path)!r} does not exist")
    size = file.stat().st_size
    if size < MIN_DATA_BYTES:
        raise ValueError(f"data file {str(path)!r} has {size} bytes; need at least "
                         f"{MIN_DATA_BYTES}")


def load_corpus(path: str | Path | None = None, *, val_fraction: float = 0.1) -> Corpus:
    """Load the standard-library corpus, or the user's text file ``path``.

    A user file is split by position: its last ``val_fraction`` is validation.

    Raises:
        ValueError: ``path`` missing, too small to split, or ``val_fraction`` outside (0, 0.5].
    """
    if not 0.0 < val_fraction <= 0.5:
        raise ValueError(f"val_fraction must be in (0, 0.5], got {val_fraction!r}")
    if path is not None:
        check_data_file(path)
        file = Path(path)
        text = file.read_bytes()[:MAX_CORPUS_BYTES]
        cut = int(len(text) * (1.0 - val_fraction))
        train, val = text[:cut], text[cut:]
        source = str(file)
    else:
        train_parts, val_parts = [], []
        for file in stdlib_files():
            (val_parts if _goes_to_val(file.name) else train_parts).append(file.read_bytes())
        train, val = b"".join(train_parts), b"".join(val_parts)
        source = str(Path(sysconfig.get_paths()["stdlib"]))
    digest = hashlib.blake2b(train + b"\0" + val, digest_size=6).hexdigest()
    return Corpus(
        train=np.frombuffer(train, dtype=np.uint8),
        val=np.frombuffer(val, dtype=np.uint8),
        source=source,
        digest=digest,
    )


def unigram_bits_per_byte(corpus: Corpus) -> float:
    """Cross-entropy of the validation bytes under the training bytes' unigram frequencies.

    The baseline any model that learned anything must beat (add-one smoothing, so a byte unseen
    in training does not make it infinite).
    """
    counts = np.bincount(corpus.train, minlength=256).astype(np.float64) + 1.0
    log_p = np.log2(counts / counts.sum())
    val_counts = np.bincount(corpus.val, minlength=256).astype(np.float64)
    return float(-(val_counts * log_p).sum() / max(val_counts.sum(), 1.0))
