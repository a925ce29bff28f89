"""Generate, verify and describe the course dataset.

No ImageNet can be downloaded on a workshop machine, so the course makes its own
ImageNet-like subset: 10,000 JPEGs of varied size (a few hundred pixels a side, about
400 x 350 on average), grainy like photographs and saved the way most of ImageNet's are
(quality 96, no chroma subsampling), so a file holds about as many bytes as an ImageNet
JPEG (~110 kB) and costs as much to read and decode; in 10 classes that differ in pattern
and colour, which a small CNN learns in a minute. Everything is a pure
function of ``(seed, index)``: generating twice gives byte-identical files, whatever the
number of processes.

Layout under the data root (see :mod:`packlab.paths`)::

    images/000000.jpg ...   one JPEG per sample, key = six-digit index
    labels.csv              key,label
    dataset.json            how it was generated (count, seed, generator version)
    manifest.csv            key,label,bytes,sha256,width,height   (written last)

The manifest is the reference every loader in the course is checked against, sample by
sample. It is also the completion marker: generation writes into a temporary folder and
moves the manifest into place last, so an interrupted run never leaves a dataset that
passes :func:`verify`.

Command line::

    python -m packlab.data            # generate unless a verified dataset is already there
    python -m packlab.data --verify   # check every file; name each missing or altered one
    python -m packlab.data --force    # regenerate regardless

Small-data mode: with ``PACKLAB_COUNT=2000`` in the environment (any count from
:data:`MIN_COUNT` up), :func:`ensure`, :func:`generate`, the command line and the
verification use that many images instead of :data:`DEFAULT_COUNT`, for a machine with
little disk (see :func:`default_count`). The images are the same kind, only fewer.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageChops

from packlab import cpus, paths, settings

#: Bump when the generator's output changes, so old datasets are regenerated.
GENERATOR_VERSION = 2
DEFAULT_COUNT = 10_000
DEFAULT_SEED = 2024
#: Environment variable that sets the number of images (small-data mode), e.g. ``2000``.
COUNT_ENV_VAR = "PACKLAB_COUNT"
#: The fewest images the course works with: the exercises' checks read subsets of up to
#: 320 samples, and the chapters are tested at 2,000.
MIN_COUNT = 500

#: The ten classes. Each is a pattern family with its own colour palette; sizes,
#: frequencies, orientations, phases and colours vary from image to image.
CLASS_NAMES = (
    "stripes",
    "checkerboard",
    "rings",
    "spokes",
    "dots",
    "waves",
    "blobs",
    "zigzag",
    "grid",
    "spiral",
)

# Two end colours per class (RGB); the pattern blends between them.
_PALETTES = np.array(
    [
        [[200, 40, 40], [250, 220, 180]],
        [[20, 20, 20], [240, 240, 240]],
        [[30, 60, 160], [180, 220, 250]],
        [[230, 150, 20], [60, 30, 10]],
        [[20, 110, 40], [230, 240, 120]],
        [[10, 90, 120], [140, 240, 230]],
        [[120, 40, 130], [240, 170, 220]],
        [[150, 90, 40], [250, 230, 200]],
        [[60, 60, 90], [250, 250, 120]],
        [[170, 20, 90], [120, 230, 90]],
    ],
    dtype=np.float32,
)


class Sample(NamedTuple):
    """One row of the manifest."""

    key: str
    label: int
    bytes: int
    sha256: str
    width: int
    height: int


MANIFEST_FIELDS = Sample._fields


class DatasetError(RuntimeError):
    """The dataset is missing or does not match its manifest."""


def count_setting() -> settings.Setting:
    """``PACKLAB_COUNT`` and where it came from: the environment, the settings file, or the default."""
    return settings.lookup(COUNT_ENV_VAR, str(DEFAULT_COUNT))


def default_count() -> int:
    """How many images the course uses: ``PACKLAB_COUNT`` when set, else :data:`DEFAULT_COUNT`.

    ``PACKLAB_COUNT`` is read from the environment, else from the checkout's settings file
    (``make configure PACKLAB_COUNT=2000``, :mod:`packlab.settings`). A smaller count is
    for machines with little disk (a JupyterHub with a small quota): the dataset and every
    packed copy shrink in proportion. Raises :class:`ValueError` naming the setting and
    where it came from when its value is not a whole number of at least :data:`MIN_COUNT`.
    """
    setting = count_setting()
    where = f" ({setting.origin()})" if setting.source != "default" else ""
    configured = (setting.value or "").strip()
    try:
        count = int(configured.replace("_", ""))
    except ValueError:
        raise ValueError(f"{COUNT_ENV_VAR}={configured!r}{where} is not a whole number of images; "
                         "unset it or use e.g. 2000") from None
    if count < MIN_COUNT:
        raise ValueError(f"{COUNT_ENV_VAR}={count}{where} is too small: the course needs at least {MIN_COUNT} images "
                         "(2000 is the tested small size)")
    return count


# --------------------------------------------------------------------------- rendering


def key_of(index: int) -> str:
    """The sample key (also the file stem) for a sample index: ``7 -> '000007'``."""
    return f"{index:06d}"


def labels_for(count: int, seed: int) -> np.ndarray:
    """Balanced labels in a seeded random order (keys are *not* sorted by class)."""
    order = np.random.default_rng([seed, 0xC1A55]).permutation(count)
    return order % len(CLASS_NAMES)


def _pattern(label: int, u: np.ndarray, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A greyscale pattern in [0, 1] for one class, on centred coordinates ``u, v``."""
    theta = rng.uniform(0, np.pi)
    a = u * np.cos(theta) + v * np.sin(theta)
    b = -u * np.sin(theta) + v * np.cos(theta)
    f = rng.uniform(4, 9)
    phase = rng.uniform(0, 2 * np.pi)
    name = CLASS_NAMES[label]
    if name == "stripes":
        return 0.5 + 0.5 * np.sin(2 * np.pi * f * a + phase)
    if name == "checkerboard":
        return 0.5 + 0.5 * np.tanh(6 * np.sin(2 * np.pi * f * a) * np.sin(2 * np.pi * f * b))
    if name == "rings":
        r = np.sqrt(u * u + v * v)
        return 0.5 + 0.5 * np.sin(2 * np.pi * f * r + phase)
    if name == "spokes":
        spokes = rng.integers(5, 12)
        return 0.5 + 0.5 * np.sin(spokes * np.arctan2(v, u) + phase)
    if name == "dots":
        da = (a * f) % 1.0 - 0.5
        db = (b * f) % 1.0 - 0.5
        return np.exp(-(da * da + db * db) / 0.03)
    if name == "waves":
        return 0.5 + 0.5 * np.sin(2 * np.pi * f * a + 2.5 * np.sin(2 * np.pi * f * 0.5 * b + phase))
    if name == "blobs":
        coarse = rng.random((6, 6), dtype=np.float32)
        h, w = np.broadcast_shapes(u.shape, v.shape)
        img = Image.fromarray(coarse, mode="F").resize((w, h), Image.BICUBIC)
        return np.clip(np.asarray(img), 0, 1)
    if name == "zigzag":
        return np.abs(((a * f + 0.6 * np.abs((b * f) % 1.0 - 0.5)) % 1.0) - 0.5) * 2
    if name == "grid":
        da = np.abs((a * f) % 1.0 - 0.5)
        db = np.abs((b * f) % 1.0 - 0.5)
        return np.maximum(da, db) ** 4 * 16
    if name == "spiral":
        r = np.sqrt(u * u + v * v)
        return 0.5 + 0.5 * np.sin(3 * np.arctan2(v, u) + 2 * np.pi * f * r + phase)
    raise ValueError(f"no pattern for label {label}")


_GRAIN: dict[int, Image.Image] = {}
#: Side of the square bank of grain that images crop theirs from (larger than any image).
_GRAIN_SIDE = 640
#: Strength of the grain, in grey levels (standard deviation): brightness detail at two
#: scales, plus a little independent colour noise.
_GRAIN_LUMA_SIGMA = 11.0
_GRAIN_CHROMA_SIGMA = 2.0
#: JPEG quality, drawn per image: most of ImageNet's training JPEGs were saved at quality
#: 96 without chroma subsampling (4:4:4); a minority at lower quality.
_QUALITIES = (92, 94, 96, 96, 96, 96, 96, 96, 96, 96)


def _grain(seed: int) -> Image.Image:
    """A seeded bank of photographic grain (built once per process) that images crop theirs from.

    A photograph is full of fine detail, and JPEG spends most of its bytes on it: a smooth
    pattern alone would give files a third of ImageNet's size that decode unrealistically
    fast. The grain is brightness detail at two scales (fine, and twice as coarse at 70 %
    of the strength) plus a little colour noise, stored as uint8 centred on 128, ready for
    ``ImageChops.add``.
    """
    if seed not in _GRAIN:
        rng = np.random.default_rng([seed, 0x6A11])
        side = _GRAIN_SIDE
        fine = rng.normal(0, 1, size=(side, side)).astype(np.float32)
        coarse = rng.normal(0, 1, size=(side // 2, side // 2)).astype(np.float32)
        coarse = np.asarray(Image.fromarray(coarse, mode="F").resize((side, side), Image.BICUBIC))
        luma = fine + 0.7 * coarse
        luma *= _GRAIN_LUMA_SIGMA / luma.std()
        colour = rng.normal(0, _GRAIN_CHROMA_SIGMA, size=(side, side, 3)).astype(np.float32)
        grain = np.clip(128 + luma[:, :, None] + colour, 0, 255).astype(np.uint8)
        _GRAIN[seed] = Image.fromarray(grain, mode="RGB")
    return _GRAIN[seed]


def render(index: int, label: int, seed: int = DEFAULT_SEED) -> tuple[bytes, int, int]:
    """Render sample ``index`` of class ``label`` as JPEG bytes; returns ``(data, width, height)``.

    The pattern is computed with numpy at half resolution; colouring, lighting and grain
    are applied at full resolution by Pillow's C code, which keeps 10k images within
    seconds on two cores. Saved like most of ImageNet: quality 96 (some 92 or 94), no
    chroma subsampling, which with the grain gives ImageNet's mean of about 110 kB a file.
    """
    rng = np.random.default_rng([seed, index])
    width = int(rng.integers(300, 501))
    height = int(rng.integers(250, 451))
    w2, h2 = width // 2, height // 2
    scale = min(w2, h2)
    u = (np.arange(w2, dtype=np.float32)[None, :] - w2 * rng.uniform(0.3, 0.7)) / scale
    v = (np.arange(h2, dtype=np.float32)[:, None] - h2 * rng.uniform(0.3, 0.7)) / scale
    p = _pattern(label, u, v, rng)[:, :, None]

    low, high = _PALETTES[label] + rng.uniform(-35, 35, size=(2, 3)).astype(np.float32)
    # Uneven lighting, as in a photograph: a smooth random brightness field.
    light = 0.8 + 0.2 * np.cos(u * rng.uniform(1, 3) + rng.uniform(0, 6)) * np.cos(v * rng.uniform(1, 3))
    half = (low + (high - low) * p) * light[:, :, None]
    image = Image.fromarray(np.clip(half, 0, 255).astype(np.uint8), mode="RGB")
    image = image.resize((width, height), Image.BILINEAR)
    grain = _grain(seed)
    x0 = int(rng.integers(0, grain.width - width))
    y0 = int(rng.integers(0, grain.height - height))
    image = ImageChops.add(image, grain.crop((x0, y0, x0 + width, y0 + height)), offset=-128)

    out = io.BytesIO()
    image.save(out, format="JPEG", quality=int(rng.choice(_QUALITIES)), subsampling=0)
    return out.getvalue(), width, height


def _render_to_file(job: tuple[int, int, int, str]) -> Sample:
    index, label, seed, folder = job
    data, width, height = render(index, label, seed)
    key = key_of(index)
    with open(os.path.join(folder, key + ".jpg"), "wb") as f:
        f.write(data)
    return Sample(key, label, len(data), hashlib.sha256(data).hexdigest(), width, height)


# ------------------------------------------------------------------------- generation


def available_cores() -> int:
    """Cores the course uses: this process's CPU affinity (containers, batch jobs), capped by ``PACKLAB_CORES``.

    See :func:`packlab.cpus.course_cores`; size a worker count with
    :func:`packlab.cpus.workers_for`, which also counts the work to share out.
    """
    return cpus.course_cores()


def generate(
    root: Path | None = None,
    count: int | None = None,
    seed: int = DEFAULT_SEED,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Generate ``count`` images (default: :func:`default_count`) under ``root`` (default: :func:`packlab.paths.data_root`).

    Renders in parallel on ``workers`` processes (default: all available cores) into a
    temporary folder beside the target, then moves the pieces into place with the
    manifest last. Anything generated before is replaced. Returns the data root.
    """
    from tqdm import tqdm

    root = Path(root) if root is not None else paths.data_root()
    count = default_count() if count is None else count
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".generate-tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".generate-tmp-{os.getpid()}"
    (tmp / "images").mkdir(parents=True)
    try:
        labels = labels_for(count, seed)
        jobs = [(i, int(labels[i]), seed, str(tmp / "images")) for i in range(count)]
        workers = workers or available_cores()
        bar = tqdm(total=count, desc="generating JPEGs", unit="img", disable=not progress)
        rows: list[Sample] = []
        if workers == 1:
            for job in jobs:
                rows.append(_render_to_file(job))
                bar.update()
        else:
            # fork is cheapest where it exists; the jobs are plain tuples, so spawn works too.
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            with multiprocessing.get_context(method).Pool(workers) as pool:
                for row in pool.imap_unordered(_render_to_file, jobs, chunksize=32):
                    rows.append(row)
                    bar.update()
        bar.close()
        rows.sort(key=lambda r: r.key)
        _write_csv(tmp / "labels.csv", ("key", "label"), [(r.key, r.label) for r in rows])
        _write_csv(tmp / "manifest.csv", MANIFEST_FIELDS, rows)
        (tmp / "dataset.json").write_text(
            json.dumps({"count": count, "seed": seed, "generator_version": GENERATOR_VERSION}, indent=2) + "\n"
        )
        _install(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _write_csv(path: Path, header, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _install(tmp: Path, root: Path) -> None:
    """Replace the dataset under ``root`` with the one in ``tmp``, manifest removed first and added last."""
    for name in ("manifest.csv", "dataset.json", "labels.csv"):
        (root / name).unlink(missing_ok=True)
    if (root / "images").exists():
        shutil.rmtree(root / "images")
    for name in ("images", "labels.csv", "dataset.json", "manifest.csv"):
        os.replace(tmp / name, root / name)


# ---------------------------------------------------------------------------- reading


def _missing_data_message(path: Path) -> str:
    return (
        f"{path} does not exist. Generate the dataset with `make data` "
        f"(or `python -m packlab.data`), or set {paths.DATA_ENV_VAR} to the folder that holds it."
    )


def load_manifest(root: Path | None = None) -> list[Sample]:
    """The manifest as a list of :class:`Sample`, sorted by key.

    Raises :class:`DatasetError` naming the file when it is missing or malformed.
    """
    path = paths.manifest_path(root)
    if not path.is_file():
        raise DatasetError(_missing_data_message(path))
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != MANIFEST_FIELDS:
            raise DatasetError(
                f"{path} has columns {reader.fieldnames}, expected {list(MANIFEST_FIELDS)}; "
                "regenerate it with `python -m packlab.data --force`."
            )
        try:
            return [
                Sample(r["key"], int(r["label"]), int(r["bytes"]), r["sha256"], int(r["width"]), int(r["height"]))
                for r in reader
            ]
        except (TypeError, ValueError) as exc:
            raise DatasetError(
                f"{path} line {reader.line_num} is malformed ({exc}); regenerate it with `python -m packlab.data --force`."
            ) from None


def load_labels(root: Path | None = None) -> dict[str, int]:
    """The labels file as ``{key: label}``; raises :class:`DatasetError` naming the file if missing."""
    path = paths.labels_path(root)
    if not path.is_file():
        raise DatasetError(_missing_data_message(path))
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != ["key", "label"]:
            raise DatasetError(f"{path} must have the header 'key,label', found {reader.fieldnames}.")
        return {row["key"]: int(row["label"]) for row in reader}


def image_path(key: str, root: Path | None = None) -> Path:
    """Path of the JPEG for ``key``."""
    return paths.images_dir(root) / f"{key}.jpg"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's contents."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------- verification


class VerifyReport(NamedTuple):
    """Result of :func:`verify`: ``ok`` and one line per problem, each naming a file."""

    ok: bool
    checked: int
    problems: list[str]


def verify(root: Path | None = None, progress: bool = False, count: int | None = None) -> VerifyReport:
    """Check every JPEG against the manifest (presence, size, SHA-256) and the labels file.

    Reports every missing, altered or unexpected file rather than stopping at the first.
    With ``count``, a dataset of another size is a problem too (the command line passes
    ``--count`` or ``$PACKLAB_COUNT`` when set, so the setting and the dataset on disk agree).
    """
    from tqdm import tqdm

    root = Path(root) if root is not None else paths.data_root()
    try:
        manifest = load_manifest(root)
    except DatasetError as exc:
        return VerifyReport(False, 0, [str(exc)])
    problems: list[str] = []
    if count is not None and len(manifest) != count:
        setting = count_setting()
        why = f" ({COUNT_ENV_VAR}={count}, {setting.origin()})" if setting.source != "default" else ""
        problems.append(
            f"{paths.manifest_path(root)} lists {len(manifest)} images, but the course is set to {count}{why}: "
            f"run `make data` (or `python -m packlab.data`) to generate {count}, or set {COUNT_ENV_VAR}={len(manifest)}"
        )
    try:
        labels = load_labels(root)
    except DatasetError as exc:
        problems.append(str(exc))
        labels = None
    if labels is not None:
        listed = {s.key: s.label for s in manifest}
        if labels != listed:
            wrong = sorted(k for k in listed.keys() | labels.keys() if labels.get(k) != listed.get(k))
            problems.append(
                f"{paths.labels_path(root)} disagrees with the manifest for {len(wrong)} keys "
                f"(first: {', '.join(wrong[:5])})"
            )
    folder = paths.images_dir(root)
    for sample in tqdm(manifest, desc="verifying", unit="img", disable=not progress):
        path = folder / f"{sample.key}.jpg"
        if not path.is_file():
            problems.append(f"missing: {path}")
        elif path.stat().st_size != sample.bytes:
            problems.append(f"altered (size {path.stat().st_size} != {sample.bytes}): {path}")
        elif sha256_file(path) != sample.sha256:
            problems.append(f"altered (sha256 differs): {path}")
    if folder.is_dir():
        expected = {f"{s.key}.jpg" for s in manifest}
        for extra in sorted(set(os.listdir(folder)) - expected):
            problems.append(f"unexpected file: {folder / extra}")
    return VerifyReport(not problems, len(manifest), problems)


def generation_settings(root: Path | None = None) -> dict | None:
    """What ``dataset.json`` records about how the dataset was generated, or None."""
    path = (Path(root) if root is not None else paths.data_root()) / "dataset.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ensure(
    root: Path | None = None,
    count: int | None = None,
    seed: int = DEFAULT_SEED,
    progress: bool = True,
) -> Path:
    """Generate the dataset unless a verified one with the same settings is already there.

    ``count`` defaults to :func:`default_count` (``PACKLAB_COUNT`` in small-data mode).
    When nothing sets the count (no ``count``, no ``PACKLAB_COUNT`` in the environment or
    the settings file) and a verified dataset of another size is there, that dataset is
    kept and a notice says how to record its size: a count forgotten in a new terminal
    never regenerates a dataset (10,000 images on a small quota) behind the user's back.
    """
    root = Path(root) if root is not None else paths.data_root()
    unset = count is None and count_setting().source == "default"
    count = default_count() if count is None else count
    wanted = {"count": count, "seed": seed, "generator_version": GENERATOR_VERSION}
    report = verify(root)
    have = generation_settings(root)
    if report.ok and have == wanted:
        if progress:
            print(f"dataset at {root} verified ({report.checked} images); nothing to do")
        return root
    if report.ok and unset and have == {**wanted, "count": report.checked}:
        print(f"dataset at {root} verified ({report.checked:,} images) and kept: no {COUNT_ENV_VAR} is set, which would "
              f"mean {count:,}. Record the size with `make configure {COUNT_ENV_VAR}={report.checked}`; to regenerate "
              f"at {count:,} images, `make configure {COUNT_ENV_VAR}={count}` and `make data`.", file=sys.stderr)
        return root
    if progress:
        if manifest_exists := paths.manifest_path(root).exists():
            reason = "; ".join(report.problems[:3]) if not report.ok else "settings changed"
            print(f"dataset at {root} needs regenerating: {reason}")
        del manifest_exists
    return generate(root, count=count, seed=seed, progress=progress)


def folder_stats(root: Path | None = None) -> dict[str, float]:
    """File count and sizes of the JPEG folder (from the manifest)."""
    manifest = load_manifest(root)
    sizes = np.array([s.bytes for s in manifest])
    dims = np.array([(s.width, s.height) for s in manifest])
    return {
        "files": len(manifest),
        "total_bytes": int(sizes.sum()),
        "mean_bytes": float(sizes.mean()),
        "mean_width": float(dims[:, 0].mean()),
        "mean_height": float(dims[:, 1].mean()),
    }


# ------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="data root (default: $PACKLAB_DATA or <repo>/data)")
    parser.add_argument("--count", type=int, default=None,
                        help=f"number of images (default ${COUNT_ENV_VAR} if set, else {DEFAULT_COUNT})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--verify", action="store_true", help="only verify; exit 1 and name every bad file")
    action.add_argument("--force", action="store_true", help="regenerate even if a verified dataset exists")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    root = args.root or paths.data_root()
    try:
        count = args.count if args.count is not None else default_count()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if args.verify:
        # The size is checked when it was asked for (--count, or PACKLAB_COUNT); otherwise
        # any dataset whose files match its manifest verifies.
        asked = args.count is not None or count_setting().source != "default"
        report = verify(root, progress=not args.quiet, count=count if asked else None)
        for problem in report.problems:
            print(problem, file=sys.stderr)
        if report.ok:
            print(f"OK: {report.checked} images under {root} match the manifest")
            return 0
        print(
            f"FAILED: {len(report.problems)} problem(s) under {root}. "
            "Regenerate with `python -m packlab.data --force`.",
            file=sys.stderr,
        )
        return 1

    if not args.quiet:
        origin = "--count" if args.count is not None else count_setting().origin()
        folder = "--root" if args.root else settings.lookup(paths.DATA_ENV_VAR, "data/ in the repository").origin()
        print(f"{count:,} images ({origin}), under {root} ({folder})")
    start = time.perf_counter()
    if args.force:
        generate(root, count=count, seed=args.seed, progress=not args.quiet)
    else:
        ensure(root, count=args.count, seed=args.seed, progress=not args.quiet)  # None: as set, or kept (ensure)
    print(f"data ready under {root} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
