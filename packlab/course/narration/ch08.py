"""Chapter 8, the process boundary: the sentences around the ceilings, the copies and the loaders compared.

Every "faster", "slower" and "as much as" comes from :func:`packlab.bench.compare`; a
comparison it cannot call clear is said to be one, in the summary too.
"""

from __future__ import annotations

from packlab.bench import Spread, compare, interval_note, verdict, with_note
from packlab.ceiling import ceiling_figure
from packlab.course.prose import provides_figures


def versus(a: Spread, b: Spread, other: str) -> str:
    """``"faster than <other>"``, ``"slower than <other>"`` or ``"not clearly different from <other>"``."""
    return verdict(a, b, f"faster than {other}", f"slower than {other}", f"not clearly different from {other}", interval=True)


def readers_text(readers: int, cores: int, shards: int, batches: int) -> str:
    """How many workers, threads or processes each loader gets, and why, when that is fewer than the cores."""
    plural = "s" * (readers != 1)
    if readers >= cores:
        return f"{readers} worker{plural}, thread{plural} or process{'es' * (readers != 1)}, one per core"
    return (f"{readers} worker{plural}, thread{plural} or process{'es' * (readers != 1)}, not one per core ({cores}): "
            f"the images make {shards} tar shards and {batches} batches of 64, and a reader without a shard or a batch "
            "would measure nothing (a tar reader without a shard stops the loader with a ShardSplitError)")


@provides_figures("one_rate", "all_rate", "scaling", "ceiling_rate", "dl_rate", "dl_share", "scaling_verdict")
def gap_figures(gap: dict[str, Spread], cores: int) -> dict:
    """The decode ceilings of one and of all cores, and the DataLoader's share of the latter.

    The scaling compares the two ceilings' medians (the same kind of run on both sides); the
    DataLoader's share is its median over the parallel ceiling's figure, its best run
    (:func:`packlab.ceiling.ceiling_figure`), as every share of a ceiling in the course.
    """
    one_core, all_cores, dataloader = (spread.median for spread in gap.values())
    bound = ceiling_figure(list(gap.values())[1])
    scale = all_cores / (cores * one_core)
    return {
        "one_rate": f"{one_core:.0f}", "all_rate": f"{all_cores:.0f}", "scaling": f"{scale:.2f}",
        "ceiling_rate": f"{bound:.0f}", "dl_rate": f"{dataloader:.0f}", "dl_share": f"{dataloader / bound:.2f}",
        "scaling_verdict": "the cores scale almost in proportion" if scale >= 0.85 else
        "less than in proportion: the processes slowed each other down (shared caches and memory, or other programs)",
    }


@provides_figures("collate_shared", "pickle_private_ms", "pickle_shared_ms", "pickle_verdict", "copy_ms_per_image", "copy_share")
def copy_figures(pickle_ms: dict[str, Spread], shared_in_worker: dict[str, bool], batch_images: int,
                 decode_ms: float) -> dict:
    """What pickling a private batch costs against one already in shared memory, per image and against a decode."""
    private, shared = pickle_ms["private batch"], pickle_ms["batch already in shared memory"]
    per_image = (private.median - shared.median) / batch_images
    return {
        "collate_shared": ", ".join(f"{name}: {'yes' if flag else 'no'}" for name, flag in shared_in_worker.items()),
        "pickle_private_ms": f"{private.median:.1f}", "pickle_shared_ms": f"{shared.median:.2f}",
        "pickle_verdict": verdict(private, shared, "clearly dearer", "clearly cheaper", "not clearly different", interval=True),
        "copy_ms_per_image": f"{per_image:.2f}",
        "copy_share": f"{per_image / decode_ms:.0%}" if compare(private, shared) == 1 else "no clear share",
    }


def per_page_text(faults: int, pages: int) -> str:
    """Whether filling a fresh batch took one page fault per page, or fewer (huge pages)."""
    if faults >= 0.9 * pages:
        return "one for each page"
    return "fewer than one per page: this kernel maps several pages per fault (huge pages)"


def memory_verdict(fresh: Spread, reused: Spread) -> str:
    """Fresh shared pages against reused ones, in words."""
    words = {1: "fresh memory was clearly dearer", -1: "fresh memory was clearly cheaper",
             0: "no clear difference between the runs"}[compare(fresh, reused)]
    return with_note(words, f"fresh ÷ reused {interval_note(fresh, reused)}")


def against_processes(threads: Spread, processes: Spread) -> str:
    """How a thread workload's speed-up compares with what processes gained, as a clause."""
    words = {1: "more than the processes gained", -1: "less than the processes gained",
             0: "not clearly different from what the processes gained"}[compare(threads, processes)]
    return with_note(words, interval_note(threads, processes))


def conversion_sentence(torch_speedup: Spread, processes: Spread) -> str:
    """Why the float conversion gained what it gained, following the measurement."""
    if compare(torch_speedup, processes) >= 0:
        return ("The conversion lost nothing measurable to the lock here: torch lets go of it inside every "
                "operation, and the Python between two calls is brief.")
    return ("The conversion gained less than the processes: each of its operations is short, so the lock changes "
            "hands often around them, and every change costs a little.")


@provides_figures("loaders_dl", "threads_fresh", "threads_recycled", "recycling_rate", "threads_vs_dl", "recycled_vs_fresh", "recycling_vs_dl", "threads_share", "recycling_share", "threads_pool", "loaders_outcome")
def loaders_figures(runs: dict[str, Spread], all_cores: float, pool_size: int) -> dict:
    """The DataLoader against the thread loader (new and recycled memory) and the recycling loader, same rounds."""
    dataloader, fresh, recycled, recycling = runs.values()
    against_dl = {name: compare(spread, dataloader) for name, spread in
                  (("the thread loader with recycled buffers", recycled), ("the thread loader with new memory", fresh),
                   ("the recycling loader", recycling))}
    clear = [name for name, direction in against_dl.items() if direction != 0]
    if not clear:
        outcome = ("none of the three was clearly different from the DataLoader on this machine: the fresh pages "
                   "they avoid did not show end to end here")
    else:
        spreads = {"the thread loader with recycled buffers": recycled, "the thread loader with new memory": fresh,
                   "the recycling loader": recycling}
        outcome = "; ".join(f"{name} {'faster' if against_dl[name] == 1 else 'slower'} than the DataLoader "
                            f"({interval_note(spreads[name], dataloader)})" for name in clear) + ", clearly"
    return {
        "loaders_dl": f"{dataloader.median:.0f}", "threads_fresh": f"{fresh.median:.0f}",
        "threads_recycled": f"{recycled.median:.0f}", "recycling_rate": f"{recycling.median:.0f}",
        "threads_vs_dl": versus(recycled, dataloader, "the DataLoader"),
        "recycled_vs_fresh": versus(recycled, fresh, "new memory per batch"),
        "recycling_vs_dl": versus(recycling, dataloader, "the DataLoader"),
        "threads_share": f"{recycled.median / all_cores:.2f}", "recycling_share": f"{recycling.median / all_cores:.2f}",
        "threads_pool": pool_size, "loaders_outcome": outcome,
    }


@provides_figures("best_ours", "best_ours_rate", "best_peer", "best_peer_rate", "ours_vs_peer", "peer_verdict")
def peer_figures(rows: list[dict], runs: dict[str, Spread], ours_group: str, peer_group: str) -> dict:
    """The fastest of ours and the fastest peer, and whether the runs tell them apart."""
    ours = max((r for r in rows if r["group"] == ours_group), key=lambda r: r["median"])
    peer = max((r for r in rows if r["group"] == peer_group), key=lambda r: r["median"])
    return {
        "best_ours": ours["name"], "best_ours_rate": f"{ours['median']:.0f}", "best_peer": peer["name"],
        "best_peer_rate": f"{peer['median']:.0f}", "ours_vs_peer": f"{ours['median'] / peer['median']:.2f}",
        "peer_verdict": versus(runs[ours["name"]], runs[peer["name"]], "the best peer"),
    }
