"""What a resume reads: counted at the opener, accounted from a saved state, and modelled for large shards."""

from __future__ import annotations

import random
from collections.abc import Callable

from packlab.resume.stream import Piece, adjacent_runs, buffered_pieces


class CountingOpener:
    """An opener that counts what it reads: the bytes read from its streams and the requests made.

    Wraps any shard opener (``opener(name)``, and ``opener.open_from(name, offset, ...)``
    when it has one, as :class:`packlab.loaders.tar.ShardOpener` and S3's do), for
    measuring what a resume costs. Counts are this process's (use it without DataLoader
    workers, or read them in the worker).
    """

    def __init__(self, opener: Callable):
        self.opener = opener
        self.bytes = self.requests = 0
        if hasattr(opener, "open_from"):
            self.open_from = self._open_from

    def __call__(self, name: str):
        return self._counted(self.opener(name))

    def _open_from(self, name: str, offset: int, etag: str | None = None, end: int | None = None):
        return self._counted(self.opener.open_from(name, offset, etag=etag, end=end))

    def _counted(self, stream):
        self.requests += 1
        counter = self

        class Counted:
            def read(self, size: int = -1) -> bytes:
                chunk = stream.read(size)
                counter.bytes += len(chunk)
                return chunk

            def close(self) -> None:
                stream.close()

        return Counted()

    def reset(self) -> None:
        self.bytes = self.requests = 0

    def __repr__(self) -> str:
        return f"CountingOpener({self.opener!r}: {self.requests} requests, {self.bytes:,} bytes)"


def resume_reads(stream_state: dict) -> dict:
    """What resuming a saved stream reads before it delivers a new sample, both ways, in bytes.

    ``stream_state`` is a reader's ``state["stream"]`` saved with byte offsets. Returns
    ``needed`` (the buffered samples' own bytes), ``by_offset`` (what a ranged resume reads:
    exactly those, in ``ranged_requests`` requests, one per run of neighbours, plus one for
    the current shard, which it opens where the next sample begins), ``from_start`` (what a
    resume that reads each shard from byte 0 reads: every buffered shard up to its last
    buffered sample, and the current shard again up to where it stopped) and
    ``shards_from_start``, the shards that resume opens.
    """
    pieces = [Piece.from_list(p) for p in stream_state["pieces"]]
    buffered = buffered_pieces(pieces, stream_state["buffer"])
    if any(piece.spans is None for _, piece in buffered):
        raise ValueError("this state holds no byte offsets (it was saved by a reader that could not read ranges)")
    needed = sum(end - begin for _, piece in buffered for begin, end in piece.spans)
    runs = sum(len(adjacent_runs(piece.spans)) for _, piece in buffered)
    from_start = sum(max(end for _, end in piece.spans) for _, piece in buffered)
    current = int(stream_state["next_piece"]) < len(pieces) and not stream_state["draining"]
    if current:
        from_start += int(stream_state["next_byte"] or 0)
    return {"needed": needed, "by_offset": needed, "ranged_requests": runs + int(current), "from_start": from_start,
            "shards_from_start": len(buffered) + int(current)}


def modelled_resume_reads(shard_bytes: float = 1e9, sample_bytes: float = 110_000, buffer: int = 1000,
                          shards: int = 4, stops: int = 40, seed: int = 0) -> dict:
    """:func:`resume_reads` for one reader of ``shards`` shards of ``shard_bytes``, averaged over ``stops`` stops.

    A model, not a measurement: samples of ``sample_bytes`` each (tar headers included),
    read in order through a shuffle buffer of ``buffer`` samples (the buffer algorithm of
    :class:`ShardStream`, on sample numbers only), stopped at positions drawn uniformly
    after the buffer has filled. Returns the mean ``needed``, ``by_offset`` and
    ``from_start`` in bytes and the mean ``shards_from_start``, per reader: multiply by the
    readers (workers x ranks) for a whole job's resume.
    """
    rng = random.Random(seed)
    per_shard = max(1, round(shard_bytes / sample_bytes))
    total = per_shard * shards
    stop_at = set(rng.sample(range(buffer + 1, total), min(stops, total - buffer - 1)))
    kept: list[int] = []
    totals = {"needed": 0.0, "by_offset": 0.0, "from_start": 0.0, "shards_from_start": 0.0}
    for sample in range(total):
        if len(kept) < buffer:
            kept.append(sample)
        else:
            kept[rng.randrange(buffer)] = sample
        if sample + 1 in stop_at:
            last_in_shard: dict[int, int] = {}
            for held in kept:
                last_in_shard[held // per_shard] = max(last_in_shard.get(held // per_shard, 0), held % per_shard + 1)
            needed = len(kept) * sample_bytes
            totals["needed"] += needed
            totals["by_offset"] += needed
            totals["from_start"] += (sum(last_in_shard.values()) + (sample + 1) % per_shard) * sample_bytes
            totals["shards_from_start"] += len(last_in_shard) + 1
    return {name: value / len(stop_at) for name, value in totals.items()}
