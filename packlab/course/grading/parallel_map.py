"""Checks of exercise 7 (``07_parallel_map``): an order-preserving parallel map over a thread pool.

The candidate is ``parallel_map(function, items, threads=2, max_in_flight=4)``, a
generator of ``function(item)`` for every item, in the items' order. The parts test what
a loader built on it needs, each with a workload that makes the mistake visible: random
delays (order), sleeps that release the GIL (parallelism), a counting input (the bound
on items in flight), one failing item (the error names it), and a look at the threads
alive before and after (none left behind, also after an error or an early ``close()``).
"""

from __future__ import annotations

import gc
import random
import threading
import time

from packlab.course.grading.core import Context, PartFailed, describe, register

#: Seconds a part waits for threads started by the candidate to end after it finished.
THREAD_GRACE = 5.0


def _results(ctx: Context, items, **options) -> list:
    """Everything the candidate yields for ``_sleepy`` over ``items``; an exception becomes a PartFailed."""
    try:
        return list(ctx.candidate(_sleepy, items, **options))
    except Exception as exc:
        raise PartFailed(f"{ctx.name}(function, items, {options}) raised {describe(exc)}") from exc


def _sleepy(item):
    """A stand-in for decoding: sleeps (releasing the GIL) for a time drawn from the item, returns item * 10."""
    time.sleep(random.Random(item).uniform(0.0, 0.02))
    return item * 10


def _in_order(ctx: Context) -> str:
    for threads, max_in_flight, count in ((4, 8, 40), (2, 3, 25), (1, 1, 5)):
        items = list(range(count))
        got = _results(ctx, iter(items), threads=threads, max_in_flight=max_in_flight)
        expected = [item * 10 for item in items]
        if got != expected:
            if sorted(got) == expected:
                raise PartFailed(f"threads={threads}: every result arrived, but out of order; first differences at "
                                 f"positions {[i for i, (a, b) in enumerate(zip(got, expected)) if a != b][:5]}")
            raise PartFailed(f"threads={threads}, {count} items: expected {count} results in order, got {len(got)}: "
                             f"{got[:8]}{' ...' if len(got) > 8 else ''}")
    if _results(ctx, iter([]), threads=2, max_in_flight=4) != []:
        raise PartFailed("no items should give no results")
    return "every result exactly once, in the order of the items (also with 1 thread, and with no items)"


def _in_parallel(ctx: Context) -> str:
    lock = threading.Lock()
    running, peak = 0, 0

    def slow(item):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.25)
        with lock:
            running -= 1
        return item

    start = time.perf_counter()
    try:
        got = list(ctx.candidate(slow, iter(range(8)), threads=4, max_in_flight=8))
    except Exception as exc:
        raise PartFailed(f"{ctx.name}(function, 8 items, threads=4, max_in_flight=8) raised {describe(exc)}") from exc
    seconds = time.perf_counter() - start
    if sorted(got) != list(range(8)):  # the order is another part's business
        raise PartFailed(f"expected the 8 results, got {got}")
    if peak > 4:
        raise PartFailed(f"{peak} calls ran at the same time with threads=4: use no more than `threads` threads")
    if peak < 2 or seconds > 1.2:
        raise PartFailed(f"8 calls of 0.25 s took {seconds:.2f} s, at most {peak} at a time: they ran one after "
                         "another, not in parallel (4 threads should need about 0.5 s)")
    return f"8 calls of 0.25 s took {seconds:.2f} s, up to {peak} at a time on 4 threads"


def _bounded(ctx: Context) -> str:
    pulled = 0

    def counting(count):
        nonlocal pulled
        for item in range(count):
            pulled += 1
            yield item

    for threads, max_in_flight in ((2, 3), (3, 6)):
        pulled = 0
        try:
            results = ctx.candidate(_identity, counting(2000), threads=threads, max_in_flight=max_in_flight)
            for received, _ in enumerate(results):
                # Taken from the items but not yet handed out: the results received and the one being handed over aside.
                if pulled > received + 1 + max_in_flight:
                    _close(results)
                    raise PartFailed(
                        f"max_in_flight={max_in_flight}: when result {received} arrived, {pulled} items had been taken "
                        f"from the input ({pulled - received - 1} in flight). Take the next item only when there is "
                        "room: an unbounded map reads a whole epoch (or an endless stream) into memory"
                    )
                if received == 60:
                    _close(results)
                    break
        except PartFailed:
            raise
        except Exception as exc:
            raise PartFailed(f"{ctx.name}(function, 2000 items, threads={threads}, max_in_flight={max_in_flight}) "
                             f"raised {describe(exc)}") from exc
    return "never more than max_in_flight items taken from the input and not yet handed out"


def _identity(item):
    return item


def _close(results) -> None:
    """Stop a result iterator early, as a loop that breaks does (generators close; others are dropped)."""
    close = getattr(results, "close", None)
    if close is not None:
        close()


class _Corrupt(ValueError):
    pass


def _fails_on_13(item):
    if item == "sample-013":
        raise _Corrupt("cannot decode: the file is truncated")
    time.sleep(0.001)
    return item.upper()


def _errors_name_the_item(ctx: Context) -> str:
    items = [f"sample-{i:03d}" for i in range(30)]
    received = []
    try:
        for result in ctx.candidate(_fails_on_13, iter(items), threads=2, max_in_flight=4):
            received.append(result)
    except Exception as exc:  # noqa: BLE001 - any exception type is fine, if it says what failed
        texts = [str(exc), str(exc.__cause__ or ""), str(exc.__context__ or "")]
        if not any("sample-013" in text for text in texts):
            raise PartFailed(f"the error does not name the item that failed ('sample-013'): {describe(exc)}") from exc
        if not any("cannot decode" in text for text in texts):
            raise PartFailed(f"the error lost the original message ('cannot decode ...'): {describe(exc)}") from exc
        return "the failing item is named in the error, with the original message"
    raise PartFailed(f"item 'sample-013' failed, but no exception reached the caller ({len(received)} results): "
                     "a failure must not be swallowed or turned into a missing or empty result")


def _no_thread_left_behind(ctx: Context) -> str:
    def new_threads(before: set) -> list[str]:
        deadline = time.monotonic() + THREAD_GRACE
        while True:
            alive = [t for t in threading.enumerate() if t not in before and t.is_alive()]
            if not alive or time.monotonic() > deadline:
                return [t.name for t in alive]
            time.sleep(0.05)

    cases = []
    before = set(threading.enumerate())
    _results(ctx, iter(range(20)), threads=3, max_in_flight=4)
    cases.append(("after a complete run", new_threads(before)))

    before = set(threading.enumerate())
    try:
        for _ in ctx.candidate(_fails_on_13, iter([f"sample-{i:03d}" for i in range(30)]), threads=3, max_in_flight=4):
            pass
    except Exception:  # noqa: BLE001 - the error itself is another part's business
        pass
    gc.collect()
    cases.append(("after an item failed", new_threads(before)))

    before = set(threading.enumerate())
    try:
        results = ctx.candidate(_sleepy, iter(range(1000)), threads=3, max_in_flight=6)
        next(iter(results)), next(iter(results))
        _close(results)
        del results
    except Exception as exc:
        raise PartFailed(f"{ctx.name}(function, 1000 items, threads=3, max_in_flight=6) raised {describe(exc)}") from exc
    gc.collect()
    cases.append(("after the caller stopped early (close())", new_threads(before)))

    leaks = [f"{when}: {len(names)} thread(s) still alive {THREAD_GRACE:g} s later ({', '.join(names[:3])})"
             for when, names in cases if names]
    if leaks:
        raise PartFailed("\n".join(leaks))
    return "every thread ends after a complete run, after an error and after an early close()"


register(
    "parallel_map", "07_parallel_map",
    "An order-preserving parallel map over a thread pool, bounded, with errors that name the item",
    "parallel_map(function, items, threads=2, max_in_flight=4) -> generator of function(item), in order",
    dict,
    [
        ("in order", "results come in the order of the items, each exactly once",
         "keep the submitted work in a queue in input order (collections.deque) and always wait for the oldest",
         _in_order),
        ("in parallel", "calls run on several threads at once, never more than `threads`",
         "submit to a concurrent.futures.ThreadPoolExecutor(max_workers=threads) and collect results later, "
         "instead of calling the function and waiting for it",
         _in_parallel),
        ("bounded", "at most max_in_flight items are taken from the input and not yet handed out",
         "take the next item from the input only while fewer than max_in_flight are pending; never list(items)",
         _bounded),
        ("errors name the item", "a failing call raises an error naming its item, with the original message",
         "catch the exception from future.result() and raise a new one whose message includes repr(item), "
         "`from` the original",
         _errors_name_the_item),
        ("no thread left behind", "no thread is left running after the end, an error, or an early close()",
         "create the executor in a `with` block inside the generator: leaving the block, for any reason, "
         "shuts it down; cancel the pending futures in a `finally`",
         _no_thread_left_behind),
    ],
)
