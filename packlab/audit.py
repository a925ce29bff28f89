"""Check what a loader delivered, sample by sample, against the manifest.

A loader can be fast and wrong: it can drop the last partial shard, deliver every
sample once per worker, mix up labels or return another sample's pixels. Throughput
numbers mean nothing until an epoch has been audited:

* every expected key arrived **exactly once** (none missing, none duplicated, none unknown);
* each key came with the **label** the manifest gives it;
* each image's **pixels** are bit-identical to the course's standard transform of the
  original JPEG (whose bytes the manifest's SHA-256 vouches for).

Loaders under audit yield ``(images, labels, keys)`` batches (the reference datasets in
:mod:`packlab.loaders` do with ``return_key=True``). Pixels are compared through short
digests so an epoch's worth of records stays small and can cross process boundaries.

A batch that crosses as **uint8** (:func:`packlab.loaders.batching.collate_uint8_batch`,
for the consumer to convert) is audited as the standard float batch it stands for: each
image is converted with the standard arithmetic (``float32(pixel) / 255``) before its
digest is taken, so the same reference serves both, and a uint8 image passes exactly
when converting it gives the standard transform's pixels bit for bit.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from packlab import data
from packlab.transforms import standard_transform


def as_standard(image: torch.Tensor) -> torch.Tensor:
    """A uint8 C x H x W image as the standard float tensor (``float32(pixel) / 255``); other tensors as they are."""
    image = image.detach().cpu()
    if image.dtype != torch.uint8:
        return image
    out = torch.empty(image.shape, dtype=torch.float32)
    torch.div(image, 255, out=out)  # the arithmetic of packlab.transforms.to_tensor
    return out


def tensor_digest(image: torch.Tensor) -> str:
    """A short SHA-256 of a tensor's values (dtype and shape included)."""
    t = image.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def reference_digests(keys: Iterable[str], root: Path | None = None) -> dict[str, str]:
    """Digest of the standard transform of each key's original JPEG.

    Checks each file's SHA-256 against the manifest first, so a damaged original is
    reported as such instead of silently becoming the reference.
    """
    manifest = {s.key: s for s in data.load_manifest(root)}
    out = {}
    for key in keys:
        path = data.image_path(key, root)
        raw = path.read_bytes()
        if hashlib.sha256(raw).hexdigest() != manifest[key].sha256:
            raise data.DatasetError(f"{path} does not match the manifest; run `python -m packlab.data --verify`.")
        out[key] = tensor_digest(standard_transform(raw, source=str(path)))
    return out


def records_from_batches(batches: Iterable, with_pixels: bool = True) -> list[tuple[str, int, str | None]]:
    """Flatten ``(images, labels, keys)`` batches into ``(key, label, pixel digest)`` records.

    uint8 images are digested as the standard float tensor they stand for (:func:`as_standard`).
    """
    records = []
    for images, labels, keys in batches:
        labels = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
        for i, key in enumerate(keys):
            digest = tensor_digest(as_standard(images[i])) if with_pixels else None
            records.append((str(key), int(labels[i]), digest))
    return records


@dataclass
class AuditReport:
    """The outcome of :func:`audit_epoch`. ``ok`` is True only when every list is empty."""

    expected: int
    delivered: int
    missing: list[str] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    wrong_labels: list[str] = field(default_factory=list)
    wrong_pixels: list[str] = field(default_factory=list)
    #: How many delivered samples had their pixels compared with the reference.
    pixels_checked: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected or self.wrong_labels or self.wrong_pixels)

    def summary(self) -> str:
        """One line per problem kind, with the first few keys of each."""
        if self.ok:
            if self.pixels_checked == self.delivered:
                checked = "labels and pixels match"
            elif self.pixels_checked:
                checked = f"labels match, pixels match for the {self.pixels_checked} samples compared"
            else:
                checked = "labels match (pixels not compared)"
            return f"OK: {self.delivered} samples, each expected key exactly once, {checked}"

        def first(keys) -> str:
            keys = sorted(keys)
            return ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")

        lines = [f"delivered {self.delivered} samples, expected {self.expected}"]
        if self.missing:
            lines.append(f"{len(self.missing)} missing: {first(self.missing)}")
        if self.duplicated:
            times = Counter(self.duplicated.values())
            how = ", ".join(f"{n} keys x{t}" for t, n in sorted(times.items()))
            lines.append(f"{len(self.duplicated)} duplicated ({how}): {first(self.duplicated)}")
        if self.unexpected:
            lines.append(f"{len(self.unexpected)} not in the expected set: {first(self.unexpected)}")
        if self.wrong_labels:
            lines.append(f"{len(self.wrong_labels)} with the wrong label: {first(self.wrong_labels)}")
        if self.wrong_pixels:
            lines.append(f"{len(self.wrong_pixels)} with pixels that differ from the reference: {first(self.wrong_pixels)}")
        return "\n".join(lines)

    __str__ = summary


def audit_epoch(
    records: Sequence[tuple[str, int, str | None]],
    expected: Sequence[data.Sample],
    reference: dict[str, str] | None = None,
) -> AuditReport:
    """Compare one epoch's ``(key, label, digest)`` records with the expected samples.

    ``reference`` maps keys to pixel digests (see :func:`reference_digests`); without it
    pixels are not checked.
    """
    by_key = {s.key: s for s in expected}
    counts = Counter(key for key, _, _ in records)
    report = AuditReport(expected=len(by_key), delivered=len(records))
    report.missing = [k for k in by_key if k not in counts]
    report.duplicated = {k: n for k, n in counts.items() if n > 1}
    report.unexpected = [k for k in counts if k not in by_key]
    seen_label: set[str] = set()
    seen_pixels: set[str] = set()
    for key, label, digest in records:
        sample = by_key.get(key)
        if sample is None:
            continue
        if label != sample.label and key not in seen_label:
            report.wrong_labels.append(key)
            seen_label.add(key)
        if reference is not None and digest is not None:
            report.pixels_checked += 1
            if digest != reference.get(key) and key not in seen_pixels:
                report.wrong_pixels.append(key)
                seen_pixels.add(key)
    return report
