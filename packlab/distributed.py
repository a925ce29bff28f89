"""Several ranks x several workers: does every rank see its own part, and all of it, once?

Run under ``torchrun``, one process per rank, each with its own DataLoader workers::

    torchrun --standalone --nproc_per_node=2 -m packlab.distributed \\
        --loader tar --shards 'data/packed/shards/shard-{000000..000009}.tar' --out /tmp/ranks
    torchrun --standalone --nproc_per_node=2 -m packlab.distributed \\
        --loader zip --zip data/packed/images-jpeg-stored.zip --out /tmp/ranks

Each rank joins a ``gloo`` process group (CPU only), reads one epoch of its part of the
data and writes the keys and labels it saw to ``<out>/rank-<r>.json``; the caller then
checks, across all files, that every key arrived exactly once (:func:`audit_ranks`).
How a rank finds its part depends on the dataset:

* ``--loader tar``: :class:`packlab.loaders.tar.TarShardDataset` splits the shard list by
  rank, then by worker. It checks the split first (:meth:`~TarShardDataset.check_split`),
  on every rank alike, so too few shards stop all ranks with the same clear error
  before the first batch;
* ``--loader zip``: the map-style :class:`packlab.loaders.zip.ZipDataset` with a
  :class:`torch.utils.data.DistributedSampler`, which hands every rank every
  ``world_size``-th index of one shared permutation. When the dataset does not divide
  evenly, the sampler *pads* by repeating indices from the start of the permutation (or,
  with ``--drop-last``, drops the tail); ``--limit`` shows it on purpose.

Several nodes: one ``torchrun`` *agent* per node, all meeting at one rendezvous address
(``--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT``); :func:`launch_nodes` starts such
agents side by side on this machine, each standing for a node. The rendezvous decides
which agent becomes node 0, 1, ... (torchrun ignores ``--node-rank`` with ``c10d``), so
nothing may assume a node's rank before the job starts. ``--split node-local`` is for
shards staged to each node's disk beforehand (:mod:`packlab.staging`): each rank then
reads the shards *its node* holds (``--shards`` may be a glob such as
``'$TMPDIR/stage/*.tar'``), split by local rank and worker, after checking that every
node holds as many shards as the others.

``python -m packlab.distributed audit --out DIR`` checks the records of a finished run
against the dataset's manifest (exit status 1 if a key is missing or repeated), for job
scripts.

Nothing here may hang a notebook or a test: the process group and its collectives time
out after ``--timeout`` seconds, so do the DataLoader's waits for its workers, and
:func:`launch` kills the whole torchrun process tree if it outlives its own timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

#: Where each rank writes what it saw.
RECORD_NAME = "rank-{rank}.json"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node=N -m packlab.distributed",
        description="Read one epoch on every rank and record the keys each rank saw.",
    )
    parser.add_argument("--loader", choices=["tar", "zip"], required=True)
    parser.add_argument("--shards", help="tar: shard list as a brace pattern, e.g. 'dir/shard-{000000..000009}.tar', "
                        "or (with --split node-local) a glob such as '/tmp/stage/*.tar'")
    parser.add_argument("--split", choices=["global", "node-local"], default="global",
                        help="tar: split all shards by global rank (default), or read this node's staged shards, "
                        "split by local rank")
    parser.add_argument("--zip", help="zip: path of an archive written by packlab.pack.write_zip")
    parser.add_argument("--out", required=True, help="folder for the per-rank JSON records")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (default 2)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epoch", type=int, default=0, help="epoch number: seeds the shard order and sampler")
    parser.add_argument("--shuffle-buffer", type=int, default=100, help="tar: shuffle buffer per worker")
    parser.add_argument("--limit", type=int, help="zip: read only the first N samples (shows sampler padding)")
    parser.add_argument("--drop-last", action="store_true", help="zip: DistributedSampler(drop_last=True)")
    parser.add_argument("--no-decode", action="store_true", help="skip JPEG decoding (keys and labels only)")
    parser.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a stuck step fails")
    args = parser.parse_args(argv)
    if args.loader == "tar" and not args.shards:
        parser.error("--loader tar needs --shards")
    if args.loader == "zip" and not args.zip:
        parser.error("--loader zip needs --zip")
    return args


def build_loader(args: argparse.Namespace, rank: int, world_size: int):
    """This rank's DataLoader (and its sampler for the zip case), yielding ``(images, labels, keys)``."""
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    from packlab.loaders.tar import TarShardDataset, skip_decode
    from packlab.transforms import standard_transform

    transform = skip_decode if args.no_decode else standard_transform
    workers = dict(num_workers=args.workers, batch_size=args.batch_size)
    if args.workers:
        workers.update(multiprocessing_context=args.start_method, timeout=args.timeout)
    if args.loader == "tar":
        shards = args.shards
        if args.split == "node-local":
            # This node's staged shards, split among this node's ranks only.
            from packlab.staging import expand_shards

            shards = expand_shards(args.shards)
            rank, world_size = local_rank_and_size()
        dataset = TarShardDataset(
            shards,
            shuffle_buffer=args.shuffle_buffer,
            transform=transform,
            return_key=True,
            rank=rank,
            world_size=world_size,
        )
        dataset.set_epoch(args.epoch)
        dataset.check_split(args.workers)  # the same arithmetic on every rank: all fail alike, before training
        return DataLoader(dataset, **workers), None

    from packlab.loaders.zip import ZipDataset

    dataset = ZipDataset(args.zip, transform=transform, return_key=True)
    if args.limit is not None:
        dataset = Subset(dataset, range(args.limit))
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0, drop_last=args.drop_last
    )
    sampler.set_epoch(args.epoch)  # without it every epoch repeats epoch 0's order
    return DataLoader(dataset, sampler=sampler, **workers), sampler


def local_rank_and_size() -> tuple[int, int]:
    """``(local rank, ranks on this node)`` from the variables torchrun sets; ``(0, 1)`` outside torchrun."""
    return int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def _check_nodes_hold_equal_parts(args: argparse.Namespace, world_size: int) -> None:
    """``--split node-local``: every node must hold as many shards as every other, or ranks would run unequal epochs.

    Every rank contributes its node's count, so every rank raises alike, before any batch.
    """
    import torch.distributed as dist

    from packlab.loaders.tar import ShardSplitError
    from packlab.staging import expand_shards

    counts: list = [None] * world_size
    dist.all_gather_object(counts, (os.environ.get("GROUP_RANK", "0"), len(expand_shards(args.shards))))
    per_node = dict(counts)
    if len(set(per_node.values())) > 1:
        raise ShardSplitError(
            f"the nodes hold different numbers of staged shards ({per_node}, by node): their ranks would run "
            "epochs of different lengths and collective training would stall. Stage an equal part on every node."
        )


def run_rank(args: argparse.Namespace) -> dict:
    """Join the process group, read one epoch, record what this rank saw, leave the group."""
    import torch.distributed as dist

    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=args.timeout))
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if args.loader == "tar" and args.split == "node-local":
            _check_nodes_hold_equal_parts(args, world_size)
        loader, sampler = build_loader(args, rank, world_size)
        keys: list[str] = []
        labels: list[int] = []
        batches = 0
        start = time.perf_counter()
        for _, batch_labels, batch_keys in loader:
            keys += list(batch_keys)
            labels += batch_labels.tolist()
            batches += 1
        seconds = time.perf_counter() - start
        # In data-parallel training every batch ends in a gradient all-reduce that all
        # ranks must join, so every rank must run the same number of batches. Compare.
        batches_per_rank: list = [None] * world_size
        dist.all_gather_object(batches_per_rank, batches)
        record = {
            "rank": rank,
            "world_size": world_size,
            "loader": args.loader,
            "workers": args.workers,
            "keys": keys,
            "labels": labels,
            "batches": batches,
            "batches_per_rank": batches_per_rank,
            "seconds": seconds,
            "sampler_length": None if sampler is None else len(sampler),
            # Where this rank ran: its node (as the rendezvous numbered it), its place there, its host.
            "node": int(os.environ.get("GROUP_RANK", 0)),
            "local_rank": local_rank_and_size()[0],
            "host": socket.gethostname(),
            "split": args.split if args.loader == "tar" else "sampler",
        }
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / RECORD_NAME.format(rank=rank)).write_text(json.dumps(record))
        print(f"rank {rank}/{world_size} (node {record['node']}, local rank {record['local_rank']}): "
              f"{len(keys)} samples in {batches} batches, {seconds:.1f} s", flush=True)
        dist.barrier()
        return record
    finally:
        dist.destroy_process_group()


def audit_main(argv: Sequence[str] | None = None) -> int:
    """``python -m packlab.distributed audit --out DIR``: exactly once, across every rank's record?"""
    from packlab import data

    parser = argparse.ArgumentParser(prog="python -m packlab.distributed audit",
                                     description="Check a run's per-rank records against the dataset's manifest.")
    parser.add_argument("--out", required=True, help="the folder the ranks wrote their records to")
    args = parser.parse_args(argv)
    records = read_rank_records(args.out)
    report = audit_ranks(records, data.load_manifest())
    for row in rank_summary(records):
        print("  " + ", ".join(f"{k}: {v}" for k, v in row.items()))
    print(report.summary())
    shared = keys_on_several_ranks(records)
    if shared:
        print(f"{len(shared)} keys were read on more than one rank, e.g. {next(iter(shared.items()))}")
    return 0 if report.ok and not shared else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["audit"]:
        return audit_main(argv[1:])
    run_rank(parse_args(argv))
    return 0


# ------------------------------------------------------------ the launcher's side


def torchrun_command(script_args: Sequence[str], nproc: int = 2) -> list[str]:
    """The command line that starts ``nproc`` ranks of this module on this machine.

    ``python -m torch.distributed.run`` is what the ``torchrun`` script runs; calling it
    through this interpreter uses the same environment. ``--standalone`` picks a free
    port for the rendezvous, so several launches can run side by side.
    """
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "packlab.distributed", *map(str, script_args),
    ]  # fmt: skip


def launch(script_args: Sequence[str], nproc: int = 2, timeout: float = 300.0) -> str:
    """Run :func:`torchrun_command` and return its output (stdout and stderr together).

    Raises ``RuntimeError`` with the output's tail if any rank failed, and
    ``TimeoutError`` if the run takes longer than ``timeout`` seconds, after killing
    torchrun *and* its rank processes (they share a new process group for this reason).
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        torchrun_command(script_args, nproc),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise TimeoutError(f"torchrun did not finish within {timeout:.0f} s and was killed. Output:\n{output[-4000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun failed with exit code {proc.returncode}. Output:\n{output[-6000:]}")
    return output


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now, for a rendezvous address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_node_command(script_args: Sequence[str], *, nnodes: int, node_rank: int, nproc: int,
                          rdzv_endpoint: str, rdzv_id: str = "packlab") -> list[str]:
    """The command line of one node's torchrun agent in an ``nnodes``-node job.

    Every agent gets the same ``--rdzv-endpoint`` and ``--rdzv-id``; the first one to
    start hosts the rendezvous store (a TCP server) there and the others connect to it.
    ``--node-rank`` is given as a job script would, but with ``c10d`` the rendezvous
    assigns the node ranks itself (torchrun warns that it ignores the option).
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}",
        "-m", "packlab.distributed", *map(str, script_args),
    ]  # fmt: skip


def launch_nodes(script_args: Sequence[str], nnodes: int = 2, nproc: int = 2, timeout: float = 300.0,
                 host: str = "127.0.0.1") -> list[str]:
    """Start ``nnodes`` torchrun agents on this machine, each standing for a node; return their outputs.

    The agents run at the same time (a rendezvous needs all of them) with a fresh
    rendezvous port each launch. Raises ``RuntimeError`` with every agent's output tail if
    any agent failed, and ``TimeoutError`` after killing all agents and their ranks (each
    agent has a process group of its own) if the launch takes longer than ``timeout``.
    """
    endpoint = f"{host}:{free_port(host)}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    agents = [
        subprocess.Popen(
            torchrun_node_command(script_args, nnodes=nnodes, node_rank=n, nproc=nproc, rdzv_endpoint=endpoint,
                                  rdzv_id=f"packlab-{os.getpid()}-{endpoint}"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
        )  # fmt: skip
        for n in range(nnodes)
    ]
    deadline = time.monotonic() + timeout
    outputs: list = [None] * nnodes
    try:
        for n, agent in enumerate(agents):
            outputs[n], _ = agent.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
        outputs = [o if o is not None else a.communicate()[0] for a, o in zip(agents, outputs)]
        tails = "\n".join(f"--- agent {n}:\n{o[-2000:]}" for n, o in enumerate(outputs))
        raise TimeoutError(f"the {nnodes} torchrun agents did not finish within {timeout:.0f} s and were killed.\n{tails}")
    failed = [n for n, agent in enumerate(agents) if agent.returncode != 0]
    if failed:
        tails = "\n".join(f"--- agent {n} (exit code {a.returncode}):\n{o[-4000:]}" for n, (a, o) in enumerate(zip(agents, outputs)))
        raise RuntimeError(f"torchrun agent(s) {failed} failed.\n{tails}")
    return outputs


def read_rank_records(out_dir: Path | str) -> list[dict]:
    """The per-rank records of one run, in rank order; checks that every rank wrote one."""
    files = sorted(Path(out_dir).glob(RECORD_NAME.format(rank="*")))
    records = sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])
    if not records:
        raise FileNotFoundError(f"no {RECORD_NAME.format(rank='*')} files in {out_dir}: did the run start?")
    world_size = records[0]["world_size"]
    if [r["rank"] for r in records] != list(range(world_size)):
        raise RuntimeError(f"{out_dir} holds records of ranks {[r['rank'] for r in records]}, expected 0..{world_size - 1}")
    return records


def audit_ranks(records: Sequence[dict], expected):
    """Audit the union of all ranks' keys and labels against the expected samples.

    Returns a :class:`packlab.audit.AuditReport`: exactly once means no key missing and
    none delivered twice, whether twice on one rank or once on each of two.
    """
    from packlab.audit import audit_epoch

    union = [(k, label, None) for r in records for k, label in zip(r["keys"], r["labels"])]
    return audit_epoch(union, expected)


def keys_on_several_ranks(records: Sequence[dict]) -> dict[str, list[int]]:
    """Keys that more than one rank saw, with the ranks that saw them."""
    seen: dict[str, list[int]] = {}
    for r in records:
        for key in set(r["keys"]):
            seen.setdefault(key, []).append(r["rank"])
    return {k: ranks for k, ranks in seen.items() if len(ranks) > 1}


def rank_summary(records: Sequence[dict]) -> list[dict]:
    """One row per rank: samples, distinct keys, batches, seconds."""
    return [
        {
            "rank": r["rank"],
            **({"node": r["node"], "local rank": r["local_rank"]} if "node" in r else {}),
            "samples": len(r["keys"]),
            "distinct keys": len(set(r["keys"])),
            "repeated on this rank": sum(n - 1 for n in Counter(r["keys"]).values() if n > 1),
            "batches": r["batches"],
            "seconds": round(r["seconds"], 1),
        }
        for r in records
    ]


if __name__ == "__main__":
    sys.exit(main())
