"""Preprocess a sharded dataset once, in parallel over its shards.

A sharded dataset is processed the way it is read: shard by shard. :func:`map_shards`
is a *map over shards*:

* each input shard is read front to back (:func:`packlab.loaders.tar.iter_shard_samples`,
  the same reader the tar loader uses, so a damaged shard fails with the same clear error);
* a per-sample function turns every sample into the files of its output sample, for
  example :func:`to_raw_pixels` (decode and resize once, store the pixels) or
  :func:`to_resized_jpeg` (decode, resize, encode again: smaller and cheaper to decode);
* the results go to exactly **one output shard per input shard**, in the input's order;
* the shards are spread over a pool of processes. A shard is the unit of work, so the
  same function scales from a laptop (``processes=cores``) to a cluster, where each task
  of an array job maps its own slice of the shard list (``inputs[i::n]``).

Three properties make it safe to run on a large dataset, where runs get killed:

* **atomic**: an output shard is written under a temporary name and renamed when it is
  complete, so a shard under its final name is always whole;
* **resumable**: a shard whose output already exists is skipped, so a run that was
  killed (time limit, pre-emption, Ctrl-C) is simply started again;
* **deterministic**: members keep the input's order and every tar header field that could
  vary (time, owner, mode) is fixed, so a killed and resumed run writes the same bytes as
  an uninterrupted one, and a shard can be checked by its checksum.

(A rename makes a shard safe against a killed *process*. Against a crash of the whole
machine the data must also be on disk first, which would take an ``fsync`` per shard.)
"""

from __future__ import annotations

import io
import multiprocessing
import os
import re
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from packlab import data
from packlab.loaders.tar import RawSample, ShardError, iter_shard_samples, iter_tar_members, split_key
from packlab.pack import _tarinfo
from packlab.transforms import decode_and_resize

#: What a per-sample function returns: the output sample's files, by extension.
SampleFiles = dict[str, bytes]


class PreprocessError(RuntimeError):
    """A shard could not be preprocessed; the message names the input shard (and sample)."""


# ------------------------------------------------------------- per-sample functions


def to_raw_pixels(sample: RawSample) -> SampleFiles:
    """``<key>.raw``: the pixels after decode and resize (256 x 256 x RGB uint8), and ``<key>.cls``.

    The same bytes as the raw-pixel zip of chapter 2: reading them back with
    :func:`packlab.transforms.pixels_to_tensor` gives exactly the standard transform of
    the original JPEG, and no decode is left to do.
    """
    pixels = decode_and_resize(sample.image_bytes, sample.source)
    return {"cls": str(sample.label).encode(), "raw": pixels.tobytes()}


def to_resized_jpeg(sample: RawSample, quality: int = 90) -> SampleFiles:
    """``<key>.jpg`` resized to 256 x 256 and encoded again (JPEG ``quality``), and ``<key>.cls``.

    Still encoded, so still small, and the tar loader reads it as it is; decoding a
    256 x 256 JPEG costs less than decoding the original and resizing it. The price is a
    second lossy encoding: the pixels differ slightly from the standard transform's.
    """
    pixels = decode_and_resize(sample.image_bytes, sample.source)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return {"cls": str(sample.label).encode(), "jpg": out.getvalue()}


# ------------------------------------------------------------------ one shard


@dataclass(frozen=True)
class ShardResult:
    """What happened to one input shard."""

    input: str
    output: str
    samples: int  # 0 when skipped
    seconds: float  # time spent reading, transforming and writing it
    process: int  # the pid of the process that did it
    skipped: bool


def _partial_name(output: Path, pid: int) -> Path:
    return output.with_name(f".{output.name}.partial-{pid}")


def write_shard(samples: Iterable[tuple[str, SampleFiles]], output: Path | str) -> int:
    """Write ``(key, files)`` samples as one tar shard at ``output``, atomically; return the count.

    Members are written in the order given, each sample's files sorted by extension, with
    fixed header fields (see :func:`packlab.pack.write_tar_shards`), under a temporary name
    that is renamed to ``output`` once the archive is complete and closed.
    """
    output = Path(output)
    partial = _partial_name(output, os.getpid())
    count = 0
    try:
        with tarfile.open(partial, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, files in samples:
                for extension in sorted(files):
                    payload = files[extension]
                    tar.addfile(_tarinfo(f"{key}.{extension}", len(payload)), io.BytesIO(payload))
                count += 1
        os.replace(partial, output)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return count


def _transformed(fn: Callable[[RawSample], SampleFiles], samples: Iterable[RawSample]) -> Iterator[tuple[str, SampleFiles]]:
    """``(key, fn(sample))`` for each sample; a failure names the sample it failed on."""
    for sample in samples:
        try:
            files = fn(sample)
        except Exception as exc:
            raise PreprocessError(
                f"preprocessing sample {sample.source} failed: {type(exc).__name__}: {exc}. No output was "
                "written for its shard; shards already done are kept."
            ) from None
        if not isinstance(files, dict) or not files or not all(isinstance(v, bytes) for v in files.values()):
            raise PreprocessError(
                f"the per-sample function returned {type(files).__name__} for {sample.source}: it must return "
                "a dict of extension -> bytes, e.g. {'cls': b'3', 'raw': pixels.tobytes()}"
            )
        yield sample.key, files


def preprocess_shard(fn: Callable[[RawSample], SampleFiles], source: str, output: str) -> ShardResult:
    """One task of :func:`map_shards`: read one input shard, apply ``fn`` to each sample, write one output shard."""
    start = time.perf_counter()
    if os.path.exists(output):  # written completely by an earlier run (outputs appear only when whole)
        return ShardResult(source, output, 0, 0.0, os.getpid(), skipped=True)
    samples = iter_shard_samples(source)  # sequential, front to back
    try:
        count = write_shard(_transformed(fn, samples), output)  # temporary name, renamed when complete
    except ShardError as exc:
        raise PreprocessError(
            f"input shard {source} cannot be read: {exc} No output was written for it; shards already done "
            "are kept. Re-create or remove that input, then run again."
        ) from None
    return ShardResult(source, output, count, time.perf_counter() - start, os.getpid(), skipped=False)


def _preprocess_job(job: tuple) -> ShardResult:
    return preprocess_shard(*job)


# ------------------------------------------------------------------ many shards


@dataclass
class MapReport:
    """The outcome of :func:`map_shards`: one :class:`ShardResult` per input shard."""

    shards: list[ShardResult]
    processes: int
    wall_seconds: float
    removed_partials: list[str] = field(default_factory=list)

    @property
    def images(self) -> int:
        """Samples written in this run (skipped shards count nothing)."""
        return sum(r.samples for r in self.shards)

    @property
    def skipped(self) -> int:
        """Shards whose output already existed."""
        return sum(r.skipped for r in self.shards)

    @property
    def images_per_s(self) -> float:
        """Samples written per second of wall time, all processes together."""
        return self.images / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    def images_per_s_by_process(self) -> dict[int, float]:
        """For each process that wrote shards: its samples per second of its own working time."""
        images: dict[int, int] = {}
        seconds: dict[int, float] = {}
        for r in self.shards:
            if not r.skipped:
                images[r.process] = images.get(r.process, 0) + r.samples
                seconds[r.process] = seconds.get(r.process, 0.0) + r.seconds
        return {pid: images[pid] / seconds[pid] for pid in images if seconds[pid] > 0}

    def summary(self) -> str:
        per_process = ", ".join(f"{rate:.0f}" for rate in self.images_per_s_by_process().values()) or "-"
        return (
            f"{len(self.shards)} shards ({self.skipped} already done, skipped), {self.images} images written in "
            f"{self.wall_seconds:.1f} s with {self.processes} process(es): {self.images_per_s:.0f} images/s in all; "
            f"per process {per_process} images/s"
        )

    __str__ = summary


def output_paths(inputs: Sequence[str | Path], folder: str | Path) -> list[Path]:
    """One output path per input shard: the input's file name, in ``folder``."""
    return [Path(folder) / Path(str(p)).name for p in inputs]


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs on this host (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel instead
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partials(outputs: Iterable[Path]) -> list[str]:
    """Delete temporary files a killed run left next to ``outputs``; return their names.

    A temporary name ends in the writer's pid; files whose process still runs on this
    host are left alone (another run may be writing them).
    """
    removed = []
    for output in outputs:
        pattern = re.compile(rf"\.{re.escape(output.name)}\.partial-(\d+)")
        if not output.parent.is_dir():
            continue
        for leftover in output.parent.glob(f".{output.name}.partial-*"):
            match = pattern.fullmatch(leftover.name)
            if match and not _pid_alive(int(match.group(1))):
                leftover.unlink(missing_ok=True)
                removed.append(str(leftover))
    return removed


def map_shards(
    fn: Callable[[RawSample], SampleFiles],
    inputs: Sequence[str | Path],
    outputs: Sequence[str | Path] | str | Path,
    processes: int | None = None,
    progress: bool = True,
) -> MapReport:
    """Apply ``fn`` to every sample of every input shard, writing one output shard per input.

    ``fn(sample)`` gets a :class:`~packlab.loaders.tar.RawSample` (``key``, ``label``,
    ``image_bytes``, ``source``) and returns the output sample's files as
    ``{extension: bytes}``; the key is kept. It must be a module-level function (or a
    :func:`functools.partial` of one) so the pool can send it to its processes.
    ``outputs`` is a list of paths, one per input, or a folder (the inputs' file names in
    it). ``processes`` defaults to the cores available; shards are handed out one at a
    time, so ``processes`` should not exceed the number of shards.

    Outputs that exist are skipped; a shard fails as a whole and names itself
    (:class:`PreprocessError`), leaving the shards already written in place. Returns a
    :class:`MapReport` (``images_per_s``, ``images_per_s_by_process()``, ``summary()``).
    """
    inputs = [str(p) for p in inputs]
    if not inputs:
        raise ValueError("no input shards given")
    outputs = output_paths(inputs, outputs) if isinstance(outputs, (str, Path)) else [Path(p) for p in outputs]
    if len(outputs) != len(inputs):
        raise ValueError(f"{len(inputs)} input shards but {len(outputs)} output paths: give one output per input")
    if len(set(outputs)) != len(outputs):
        raise ValueError("two input shards would be written to the same output path")
    clash = sorted({str(p.resolve()) for p in outputs} & {str(Path(p).resolve()) for p in inputs})
    if clash:
        raise ValueError(f"an output would overwrite its input: {clash[0]}; write the outputs to another folder")
    missing = [p for p in inputs if not os.path.exists(p)]
    if missing:
        raise PreprocessError(f"input shard {missing[0]} does not exist ({len(missing)} missing); check the list or pattern")
    for folder in {p.parent for p in outputs}:
        folder.mkdir(parents=True, exist_ok=True)
    removed = remove_stale_partials(outputs)
    processes = max(1, min(processes or data.available_cores(), len(inputs)))

    from tqdm import tqdm

    jobs = [(fn, source, str(output)) for source, output in zip(inputs, outputs)]
    bar = tqdm(total=len(jobs), desc="map_shards", unit="shard", disable=not progress)
    results: list[ShardResult] = []
    start = time.perf_counter()
    try:
        if processes == 1:
            finished: Iterable[ShardResult] = map(_preprocess_job, jobs)
            results = _collect(finished, bar, start)
        else:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            with multiprocessing.get_context(method).Pool(processes) as pool:
                results = _collect(pool.imap_unordered(_preprocess_job, jobs, chunksize=1), bar, start)
    except BaseException:
        # A failed shard ends the pool, killing the shards still being written: clear their temporary files.
        remove_stale_partials(outputs)
        raise
    finally:
        bar.close()
    order = {source: i for i, source in enumerate(inputs)}
    results.sort(key=lambda r: order[r.input])
    report = MapReport(results, processes, time.perf_counter() - start, removed)
    if progress:
        print(report.summary())
    return report


def _collect(finished: Iterable[ShardResult], bar, start: float) -> list[ShardResult]:
    """Gather shard results as they finish, advancing the progress bar."""
    results = []
    images = 0
    for result in finished:
        results.append(result)
        images += result.samples
        bar.update()
        bar.set_postfix(images=images, rate=f"{images / max(time.perf_counter() - start, 1e-9):.0f} img/s")
    return results


# ------------------------------------------------------------------ reading outputs


def iter_samples(shard: str | Path) -> Iterator[tuple[str, SampleFiles]]:
    """``(key, {extension: bytes})`` for each sample of any WebDataset-style shard, in order.

    Unlike :func:`packlab.loaders.tar.iter_shard_samples` it does not insist on ``.jpg``
    and ``.cls``: it reads the outputs of :func:`map_shards`, whatever files they hold.
    """
    shard = str(shard)
    with open(shard, "rb") as stream:
        key, files = None, {}
        for name, payload in iter_tar_members(stream, shard):
            member_key, extension = split_key(name)
            if member_key != key:
                if key is not None:
                    yield key, files
                key, files = member_key, {}
            files[extension] = payload
        if key is not None:
            yield key, files


def main(argv: list[str] | None = None) -> int:
    import argparse

    from packlab.pack import expand_pattern

    functions = {"raw": to_raw_pixels, "jpeg256": to_resized_jpeg}
    parser = argparse.ArgumentParser(
        prog="python -m packlab.preprocess",
        description="Preprocess tar shards once: one output shard per input, in parallel, resumable.",
    )
    parser.add_argument("inputs", nargs="+", help="input shards, or a brace pattern such as 'shard-{000000..000009}.tar'")
    parser.add_argument("--out", required=True, help="output folder (each output keeps its input's file name)")
    parser.add_argument("--to", choices=sorted(functions), default="raw",
                        help="raw: decoded 256x256 pixels; jpeg256: resized to 256x256 and encoded again")
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: the cores available)")
    args = parser.parse_args(argv)
    inputs = [name for pattern in args.inputs for name in expand_pattern(pattern)]
    try:
        map_shards(functions[args.to], inputs, args.out, processes=args.processes)
    except PreprocessError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
