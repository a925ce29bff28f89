"""Sentences of chapter 0, "The dataset"."""

from __future__ import annotations


def size_against_imagenet(ratio: float) -> str:
    """Our mean file size as a share of ImageNet's, for "Our files average N kB, <this> mean of M kB"."""
    if 0.8 <= ratio <= 1.25:
        return "about the same as ImageNet's"
    return f"{ratio:.2f} times ImageNet's"
