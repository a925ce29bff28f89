"""Real ranks on this machine: processes joined by a ``gloo`` group, each step timed as wait, compute, exchange."""

from __future__ import annotations

import socket
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from packlab.stragglers import waits as _waits
from packlab.stragglers.waits import LOAD, BatchWaits, _drive, _ms

# ----------------------------------------------------------------------------- real ranks


@dataclass(frozen=True)
class RankRun:
    """What one rank of :func:`run_ranks` measured. Seconds throughout.

    ``waits``, ``steps`` and ``exchange`` (the ``all_reduce``, which includes waiting for the
    other ranks to arrive) are per timed step; ``production`` are the per-worker production
    times of the calibration batches, measured with no compute, while the other ranks
    produced too.
    """

    rank: int
    waits: np.ndarray
    steps: np.ndarray
    exchange: np.ndarray
    production: np.ndarray
    compute_s: float
    workers: int

    def row(self) -> dict:
        """One table row, milliseconds with one decimal."""
        q = np.quantile(self.waits, [0.5, 0.9, 0.99])
        return {"rank": self.rank, "workers": self.workers, "steps": len(self.steps),
                "wait p50 ms": _ms(q[0]), "wait p90 ms": _ms(q[1]), "wait p99 ms": _ms(q[2]),
                "wait max ms": _ms(np.max(self.waits)), "all_reduce p50 ms": _ms(np.median(self.exchange)),
                "mean step ms": _ms(np.mean(self.steps)), "p99 step ms": _ms(np.quantile(self.steps, 0.99))}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, make_loader: Callable, plan: dict, results) -> None:
    """One rank: join the group, start-up, calibrate (no compute), agree on the compute, run the timed steps."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=plan["timeout"]))
        try:
            workers, startup = plan["workers"], max(1, plan["workers"])
            gradient = torch.zeros(plan["gradient_numel"])
            dist.barrier()  # every rank's loader starts together, so the calibration runs under the job's contention
            begin = _waits._clock()
            iterator = iter(make_loader(rank, world_size, workers))
            _, _, arrivals = _drive(iterator, startup + plan["calibrate"], 0.0)
            production = BatchWaits(np.zeros(0), np.zeros(0), np.array(arrivals) - begin, 0.0, workers,
                                    startup).production_times()
            compute_s = plan["compute_s"]
            if compute_s is None:  # every rank uses the same compute: the load times the ranks' mean production
                mean = torch.tensor([float(np.mean(production)) / startup], dtype=torch.float64)
                dist.all_reduce(mean)
                compute_s = plan["load"] * float(mean) / world_size
            exchange: list[float] = []

            def all_reduce():
                start = _waits._clock()
                dist.all_reduce(gradient)
                exchange.append(_waits._clock() - start)

            waits, steps, _ = _drive(iterator, plan["steps"], compute_s, on_step=all_reduce)
            results.put({"rank": rank, "waits": waits, "steps": steps, "exchange": exchange, "production": list(production),
                             "compute_s": compute_s, "workers": workers})
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put({"rank": rank, "error": traceback.format_exc()})
        raise


def run_ranks(make_loader: Callable[[int, int, int], Iterable], steps: int = 80, workers: int = 1,
              compute_s: float | None = None, load: float = LOAD, calibrate: int = 25, ranks: int = 2,
              timeout: float = 60.0, gradient_numel: int = 1024) -> list[RankRun]:
    """Run ``ranks`` real ranks as forked processes joined by a ``gloo`` group on 127.0.0.1; return each rank's run.

    ``make_loader(rank, world_size, workers)`` builds a rank's own loader over its part of
    the data (called in the rank's process). Every rank, after ``max(1, workers)`` start-up
    batches, reads ``calibrate`` batches with no compute (its production times), then runs
    ``steps`` timed steps: wait for the batch, compute ``compute_s`` seconds (a sleep: the
    CPU stays free for the workers, as with a GPU step), then ``all_reduce`` a small tensor
    of ``gradient_numel`` floats, the synchronous gradient exchange. ``compute_s=None``
    takes ``load`` times the ranks' mean production time per batch, agreed by all ranks.

    Ranks and their loader workers share this machine's cores: give ``workers`` such that
    ``ranks * workers`` is about :func:`packlab.data.available_cores`. Nothing hangs: the
    group's collectives time out after ``timeout`` seconds, and the whole run is given
    ``2 * timeout`` before every rank still alive is killed and ``TimeoutError`` raised.
    """
    import multiprocessing as mp

    context = mp.get_context("fork")
    results = context.Queue()
    plan = {"steps": steps, "workers": workers, "compute_s": compute_s, "load": load, "calibrate": calibrate,
                "timeout": timeout, "gradient_numel": gradient_numel}
    port = free_port()
    procs = [context.Process(target=_rank_main, args=(r, ranks, port, make_loader, plan, results), daemon=False)
             for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        got = _collect(results, procs, ranks, deadline=time.monotonic() + 2 * timeout)
        for p in procs:
            p.join(timeout=max(1.0, timeout / 4))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    return [RankRun(g["rank"], np.array(g["waits"]), np.array(g["steps"]), np.array(g["exchange"]),
                    np.array(g["production"]), g["compute_s"], g["workers"]) for g in sorted(got, key=lambda g: g["rank"])]


def _collect(results, procs, ranks: int, deadline: float) -> list[dict]:
    """Every rank's result from the queue; raises on the first rank's error, a rank that died silently, or the deadline."""
    import queue

    got: list[dict] = []
    while len(got) < ranks:
        try:
            item = results.get(timeout=0.2)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {ranks} ranks did not finish in time; {len(got)} reported") from None
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                time.sleep(0.5)  # its error report may still be on its way
                if results.empty():
                    raise RuntimeError(f"rank process(es) exited with codes {[p.exitcode for p in dead]} "
                                       "without a report") from None
            continue
        if "error" in item:
            raise RuntimeError(f"rank {item['rank']} failed:\n{item['error']}")
        got.append(item)
    return got


