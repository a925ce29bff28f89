"""Copy a node's shards to its local disk before training, and when that pays off.

Cluster guides give one rule for data on shared storage: when a job reads its data many
times, copy it to the node's local SSD first and read it from there; when it reads it
once, read it where it is. Copying costs one pass over the network *plus* a write; every
later epoch then reads locally. So staging pays off after

    break-even epochs = copy time / (epoch time in place - epoch time from local disk)

epochs, and never when local reads are not faster. :func:`break_even_epochs` computes it
from measured times; chapter 10 measures them.

Which shards does a node need? With :class:`~packlab.loaders.tar.TarShardDataset`'s
default, the shard order is reshuffled every epoch *before* the rank split, so a rank
reads different shards each epoch and a node would need all of them. Staging a part
per node therefore fixes the split by node instead: node *n* of *N* copies
``shards[n::N]`` (:func:`node_shards`) and its ranks read only those, splitting them by
*local* rank and worker, with the order reshuffled within the node every epoch. Every
sample is still read exactly once per epoch across all nodes; what changes is that a
node sees the same part of the dataset in every epoch. (With shards written from a
shuffled sample order, each part is a random sample of the whole, and the gradient
all-reduce mixes the nodes' contributions at every step.)

A copy never leaves a half-written shard under its final name: it is written to a
temporary name in the same folder, its size is checked against the source's, and only
then renamed (``os.replace``, atomic within one filesystem). A shard that is already
there with the right size is reused, so a second job on the same node, or a restarted
one, copies nothing.

``python -m packlab.staging`` does the copy from a job script, one task per node (see
``scripts/slurm/``); where the node-local folder is differs between sites
(:func:`node_local_dir`).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from packlab.loaders.tar import ShardError, ShardSplitError, open_shard, split_shards_by_rank

#: Bytes per read while copying: large reads, as a copy over a network filesystem should make.
COPY_CHUNK = 8 * 1024 * 1024


def node_local_dir(environ=os.environ) -> Path:
    """The node-local folder to stage into: the first of these variables that is set.

    ``PACKLAB_STAGE_DIR`` (yours, to override), ``SLURM_TMPDIR`` (a per-job folder on
    node-local disk that some sites' Slurm sets), ``TMPDIR`` (per job on sites that use
    Slurm's ``job_container/tmpfs`` plugin, often plain ``/tmp`` elsewhere), else ``/tmp``.
    Ask your site which folder is on the node's SSD: on some clusters ``/tmp`` is in memory
    and small.
    """
    for name in ("PACKLAB_STAGE_DIR", "SLURM_TMPDIR", "TMPDIR"):
        if environ.get(name):
            return Path(environ[name])
    return Path("/tmp")


def node_shards(shards: Sequence[str], node_rank: int, num_nodes: int) -> list[str]:
    """The shards node ``node_rank`` of ``num_nodes`` stages: every ``num_nodes``-th, fixed for the whole run.

    Every node must get the same number of shards (the ranks of a node with fewer would
    run out of batches first), so the count must divide by the number of nodes.
    """
    if num_nodes > 1 and len(shards) % num_nodes:
        raise ShardSplitError(
            f"{len(shards)} shards cannot be shared equally by {num_nodes} nodes; write a multiple of {num_nodes}."
        )
    return split_shards_by_rank(list(shards), node_rank, num_nodes)


def expand_shards(pattern: str) -> list[str]:
    """Shard names from a brace pattern (``shard-{000000..000007}.tar``) or a glob (``/stage/*.tar``), in order."""
    from packlab.pack import expand_pattern

    if any(c in pattern for c in "*?["):
        found = sorted(glob.glob(pattern))
        if not found:
            raise FileNotFoundError(f"no shards match {pattern}")
        return found
    return expand_pattern(pattern)


def _size_without_reading(source: str, opener: Callable) -> int | None:
    """The source's size in bytes without opening it for reading: the opener's ``size()``, or a local file's; else None."""
    size = getattr(opener, "size", None)
    if callable(size):
        return int(size(source))
    scheme = urllib.parse.urlparse(source).scheme
    if scheme in ("", "file"):
        path = urllib.parse.urlparse(source).path if scheme == "file" else source
        return os.path.getsize(path) if os.path.exists(path) else None
    return None


def _expected_size(source: str, stream) -> int | None:
    """The source's size in bytes: announced by the stream (an object store's Content-Length) or the file's."""
    size = getattr(stream, "size", None)
    if size is not None:
        return int(size)
    length = getattr(stream, "length", None)  # urllib's HTTP response, unread: its Content-Length
    if isinstance(length, int):
        return length
    scheme = urllib.parse.urlparse(source).scheme
    if scheme in ("", "file"):
        return os.path.getsize(urllib.parse.urlparse(source).path if scheme == "file" else source)
    return None


@dataclass
class StagedShard:
    """One shard on local disk, and what it took to put it there."""

    source: str
    path: Path
    bytes: int
    seconds: float
    copied: bool  # False: it was already there, with the right size


def stage_shard(source: str, dest_dir: Path | str, opener: Callable[[str], BinaryIO] = open_shard) -> StagedShard:
    """Copy one shard into ``dest_dir`` (same file name) with a size check and an atomic rename.

    ``opener`` reads the source, as for a dataset: a path, an ``http(s)://`` URL, or
    ``s3://`` with :class:`packlab.objectstore.S3ShardOpener`. A copy already there is
    kept when its size matches the source's, asked without reading the source where the
    opener can tell it (``S3ShardOpener.size``: one ``HEAD``) or the source is a file.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = Path(urllib.parse.urlparse(source).path).name or Path(source).name
    target = dest_dir / name
    start = time.perf_counter()
    if target.exists():
        # A copy already there is checked by size without reading the source: an opener that can tell the size
        # (S3ShardOpener.size: a HEAD, no body) or a local file's. Opening the stream instead would send a GET whose
        # body starts flowing (megabytes of it) only to be dropped.
        known = _size_without_reading(source, opener)
        if known is not None and target.stat().st_size == known:
            return StagedShard(source, target, known, time.perf_counter() - start, copied=False)
    stream = opener(source)
    try:
        expected = _expected_size(source, stream)
        if expected is not None and target.exists() and target.stat().st_size == expected:
            return StagedShard(source, target, expected, time.perf_counter() - start, copied=False)
        partial = target.with_name(f".{name}.partial-{os.getpid()}")
        written = 0
        try:
            with open(partial, "wb") as out:
                while chunk := stream.read(COPY_CHUNK):
                    out.write(chunk)
                    written += len(chunk)
            if expected is not None and written != expected:
                raise ShardError(
                    f"staging {source} to {target}: copied {written:,} bytes, the source has {expected:,}. "
                    "The copy was cut short; run the staging again."
                )
            os.replace(partial, target)  # atomic: the final name only ever holds a complete shard
        finally:
            partial.unlink(missing_ok=True)
    finally:
        stream.close()
    return StagedShard(source, target, written, time.perf_counter() - start, copied=True)


@dataclass
class StagingReport:
    """What :func:`stage_shards` did."""

    shards: list[StagedShard] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def paths(self) -> list[Path]:
        return [s.path for s in self.shards]

    @property
    def bytes_copied(self) -> int:
        return sum(s.bytes for s in self.shards if s.copied)

    def summary(self) -> str:
        copied = sum(s.copied for s in self.shards)
        return (
            f"{len(self.shards)} shards in {self.shards[0].path.parent if self.shards else '-'}: {copied} copied "
            f"({self.bytes_copied / 1e6:.1f} MB in {self.seconds:.2f} s), {len(self.shards) - copied} already there"
        )


def stage_shards(sources: Sequence[str], dest_dir: Path | str, opener: Callable[[str], BinaryIO] = open_shard) -> StagingReport:
    """Copy every shard in ``sources`` into ``dest_dir`` (see :func:`stage_shard`); return the local paths and timings."""
    report = StagingReport()
    start = time.perf_counter()
    for source in sources:
        report.shards.append(stage_shard(str(source), dest_dir, opener))
    report.seconds = time.perf_counter() - start
    return report


def break_even_epochs(copy_seconds: float, in_place_epoch_seconds: float, local_epoch_seconds: float) -> float:
    """Epochs after which staging has paid for itself: ``copy / (in place - local)``; ``inf`` if local is not faster.

    Reading in place for *E* epochs costs ``E * in_place``; staging costs ``copy + E *
    local``. They are equal at the returned *E*; for more epochs, staging wins.
    """
    saving = in_place_epoch_seconds - local_epoch_seconds
    return copy_seconds / saving if saving > 0 else float("inf")


# ------------------------------------------------------------------ from a job script


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m packlab.staging",
        description="Copy this node's part of the shards to node-local disk (one task per node).",
    )
    parser.add_argument("--shards", required=True, help="all shards: a brace pattern, a glob, or s3:// URLs in braces")
    parser.add_argument("--dest", help="folder on node-local disk (default: see packlab.staging.node_local_dir)")
    parser.add_argument("--node-rank", type=int, default=int(os.environ.get("SLURM_NODEID", 0)),
                        help="this node's index (default: $SLURM_NODEID, else 0)")
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("SLURM_NNODES", 1)),
                        help="number of nodes (default: $SLURM_NNODES, else 1)")
    args = parser.parse_args(argv)

    shards = expand_shards(args.shards)
    mine = node_shards(shards, args.node_rank, args.nodes)
    opener = open_shard
    if any(s.startswith("s3://") for s in mine):
        from packlab.objectstore import S3Settings, S3ShardOpener

        opener = S3ShardOpener(S3Settings.from_environment())
    dest = Path(args.dest) if args.dest else node_local_dir()
    report = stage_shards(mine, dest, opener)
    print(f"node {args.node_rank}/{args.nodes} ({os.uname().nodename}): {report.summary()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
