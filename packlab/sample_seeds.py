"""The course's one per-sample seed: a sample's randomness from ``(seed, epoch, index)`` alone.

Chapter 12 teaches these as :mod:`packlab.seeding`'s (which re-exports them); chapter 11's
crops (:mod:`packlab.crops`) draw from them. They live in a module of their own so that both
can import them, and :mod:`packlab.seeding` can import :mod:`packlab.crops`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one sample's randomness, from ``(seed, epoch, index)`` alone (non-negative integers).

    ``numpy.random.SeedSequence`` hashes its entropy words into well-mixed bits, so
    neighbouring indices or epochs give unrelated seeds; the result is the same in every
    process, on every machine. For samples named by a string key, use :func:`key_number`.
    """
    words = np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint32)
    return (int(words[0]) << 32 | int(words[1])) & (2**63 - 1)


def key_number(key: str) -> int:
    """A sample key as a 64-bit integer for :func:`sample_seed`: BLAKE2b of its UTF-8 bytes, the same everywhere.

    Not ``hash(key)``: Python randomises string hashes per process (``PYTHONHASHSEED``), so
    two ``spawn`` workers, or a run and its resumed run, would disagree.
    """
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A torch generator for one sample's randomness: pass it to the random transforms' draws."""
    return torch.Generator().manual_seed(sample_seed(seed, epoch, index))
