"""Checks of exercise 7 (``07_parallel_map``): an order-preserving parallel map over a thread pool.

The candidate is ``parallel_map(function, items, threads=2, max_in_flight=4)``, a
generator of ``function(item)`` for every item, in the items' order. The parts test what
a loader built on it needs, each with a workload that makes the mistake visible: random
delays (order); items that repeat, are ``None``, falsy or unhashable, given as a list, a
tuple, a string, a range or a generator (any iterable), and a function that returns
``None`` for most items (a filter's verdict); sleeps that release the GIL
(parallelism, counted at the peak); a counting input, also behind one slow item that
holds up the head of the line (the bound on items in flight); one failing item (the
error names it, keeps the original, and comes after the results before it); and a look
at the threads alive right after the end, an error or an early ``close()``, while work
that takes a second is still running (none left behind).
"""

from __future__ import annotations

import gc
import random
import threading
import time

from packlab.course.grading.core import Context, PartFailed, describe, register

#: Seconds a part waits for threads started by the candidate to end after it returned.
#: Threads that were joined are gone at once; one polling a stop flag needs a moment.
THREAD_GRACE = 0.3
#: Seconds each call takes in the part that looks for threads left behind: longer than
#: THREAD_GRACE, so that threads left to finish their call are still running when counted.
SLOW_CALL = 1.0


def _collect(results, most: int) -> list:
    """The results, stopping with a failure when there are more than ``most`` (a map that never ends)."""
    out = []
    for result in results:
        out.append(result)
        if len(out) > most:
            _close(results)
            raise PartFailed(f"more results than items ({len(out)} from {most}): the map does not end where the input "
                             "does (a list read again from its start by each islice()?)")
    return out


def _call(ctx: Context, function, items, count: int, **options) -> list:
    """Everything the candidate yields for ``count`` items; an exception becomes a PartFailed naming the call."""
    try:
        return _collect(ctx.candidate(function, items, **options), count)
    except PartFailed:
        raise
    except Exception as exc:
        raise PartFailed(f"{ctx.name}(function, items, {_options(options)}) raised {describe(exc)}") from exc


def _options(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())


def _delay(item) -> float:
    """A delay drawn from the item's repr: the same for equal items, different for most others."""
    return random.Random(repr(item)).uniform(0.0, 0.02)


def _sleepy(item):
    """A stand-in for decoding: sleeps (releasing the GIL) for a time drawn from the item, returns item * 10."""
    time.sleep(_delay(item))
    return item * 10


def _in_order(ctx: Context) -> str:
    for threads, max_in_flight, count in ((4, 8, 40), (3, 7, 30), (2, 3, 25), (1, 1, 5)):
        items = list(range(count))
        options = dict(threads=threads, max_in_flight=max_in_flight)
        got = _call(ctx, _sleepy, iter(items), count, **options)
        expected = [item * 10 for item in items]
        if got != expected:
            if sorted(got) == expected:
                raise PartFailed(f"{_options(options)}: every result arrived, but out of order; first differences at "
                                 f"positions {[i for i, (a, b) in enumerate(zip(got, expected)) if a != b][:5]}")
            raise PartFailed(f"{_options(options)}, {count} items: expected {count} results in order, got {len(got)}: "
                             f"{got[:8]}{' ...' if len(got) > 8 else ''}")
    if _call(ctx, _sleepy, iter([]), 0, threads=2, max_in_flight=4) != []:
        raise PartFailed("no items should give no results")
    return "every result exactly once, in the order of the items (also with 1 thread, and with no items)"


def _tagged(item):
    """Returns ``("done", item)`` after a delay drawn from the item's repr; works for any item."""
    time.sleep(_delay(item) / 2)
    return ("done", item)


#: Items of every kind a stream can hold: repeated, None, falsy, unhashable, nested.
_MIXED = [3, None, [1, 2], 0, 3, {"a": 1}, "", None, [1, 2], False, 7.5, (), b"x", {"a": 1}, 3]


def _expected(function, item):
    """What ``function`` gives for ``item``, without its delay."""
    return ("done", item) if function is _tagged else (item if item % 3 == 0 else None)


def _what_went_wrong(items: list, got: list, expected: list) -> str:
    """A guess at the mistake behind a wrong result list, in words (empty when there is none to make)."""
    if len(got) < len(expected) and got == expected[: len(got)] and expected[len(got)] is None:
        return (f" The results stop just before item {len(got)}, whose result is None: a result that is None must be "
                "handed back like any other, not taken for the end (pass results on with a marker object of your own)")
    if len(got) < len(expected) and got == expected[: len(got)]:
        stop = items[len(got)]
        if stop is None or not stop:
            return (f" The results stop just before item {len(got)}, {stop!r}: an item that is None or falsy must "
                    "not be taken for the end of the input (use a sentinel object of your own, or StopIteration)")
        return " The results stop early."
    if len(got) < len(expected):
        return (" Items that appear more than once came back fewer times: do not key anything by the item "
                "(items repeat, and need not be hashable); keep them in input order instead")
    return ""


def _kept_or_none(item):
    """A filter's verdict: the item when it is kept (multiples of three), None when it is to be dropped."""
    time.sleep(_delay(item) / 2)
    return item if item % 3 == 0 else None


def _any_items(ctx: Context) -> str:
    cases = [
        ("a list with repeated, None, falsy and unhashable items", _MIXED * 2, _tagged),
        ("a generator of the same", (item for item in _MIXED), _tagged),
        ("a tuple", tuple(_MIXED), _tagged),
        ("a string (its characters, some repeated)", "abracadabra", _tagged),
        ("a range", range(12), _tagged),
        ("a function that returns None for most items (a filter's verdict)", range(1, 13), _kept_or_none),
    ]
    for what, items, function in cases:
        listed = list(items) if not hasattr(items, "__next__") else list(_MIXED)
        expected = [_expected(function, item) for item in listed]
        try:
            got = _collect(ctx.candidate(function, items, threads=3, max_in_flight=4), len(expected))
        except PartFailed:
            raise
        except Exception as exc:
            text = describe(exc)
            advice = ""
            if "unhashable" in text:
                advice = " Items need not be hashable (lists, dicts): do not use them as dict keys or in sets."
            elif "not an iterator" in text or "has no len" in text or "not subscriptable" in text:
                advice = " `items` may be any iterable: take iter(items) and call next() on that."
            raise PartFailed(f"{what}: {ctx.name} raised {text}.{advice}") from exc
        if got != expected:
            raise PartFailed(f"{what}: expected {len(expected)} results in order, got {len(got)}."
                             + _what_went_wrong(listed, got, expected))
    return "lists, tuples, strings, ranges and generators; repeated, None, falsy and unhashable items; None results"


def _in_parallel(ctx: Context) -> str:
    results = []
    for threads, max_in_flight, count, seconds_each in ((4, 8, 8, 0.2), (3, 7, 9, 0.15)):
        lock = threading.Lock()
        running = peak = 0

        def slow(item):
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(seconds_each)
            with lock:
                running -= 1
            return item

        options = dict(threads=threads, max_in_flight=max_in_flight)
        start = time.perf_counter()
        got = _call(ctx, slow, iter(range(count)), count, **options)
        seconds = time.perf_counter() - start
        if sorted(got) != list(range(count)):  # the order is another part's business
            raise PartFailed(f"{_options(options)}: expected the {count} results, got {got}")
        ideal = count / threads * seconds_each
        if peak > threads:
            raise PartFailed(f"{peak} calls ran at the same time with threads={threads} (max_in_flight="
                             f"{max_in_flight}): use exactly `threads` threads, not more")
        if peak < threads or seconds > 1.6 * ideal + 0.2:
            raise PartFailed(
                f"{count} calls of {seconds_each} s with {_options(options)} took {seconds:.2f} s, at most {peak} at a "
                f"time: with {threads} threads they should run {threads} at a time and take about {ideal:.1f} s"
                + (" (they ran one after another)" if peak == 1 else "")
            )
        results.append(f"{threads} threads: {count} calls of {seconds_each} s in {seconds:.2f} s, {peak} at a time")
    return "; ".join(results)


def _identity(item):
    return item


def _close(results) -> None:
    """Stop a result iterator early, as a loop that breaks does (generators close; others are dropped)."""
    close = getattr(results, "close", None)
    if close is not None:
        close()


def _bounded(ctx: Context) -> str:
    pulled = 0

    def counting(count):
        nonlocal pulled
        for item in range(count):
            pulled += 1
            yield item

    def slow_first(item):
        """The first item holds up the head of the line; the others are instant."""
        if item == 0:
            time.sleep(0.3)
        return item

    cases = [(_identity, 2, 3, "instant calls"), (_identity, 3, 6, "instant calls"), (_identity, 2, 1, "instant calls"),
             (slow_first, 3, 4, "the first call slow, the others instant")]
    for function, threads, max_in_flight, what in cases:
        pulled = 0
        options = dict(threads=threads, max_in_flight=max_in_flight)
        try:
            results = ctx.candidate(function, counting(2000), **options)
            for received, _ in enumerate(results):
                # Taken from the items but not yet handed out: the results received and the one being handed over aside.
                if pulled > received + 1 + max_in_flight:
                    _close(results)
                    raise PartFailed(
                        f"{_options(options)}, {what}: when result {received} arrived, {pulled} items had been taken "
                        f"from the input ({pulled - received - 1} in flight). Take the next item only when fewer than "
                        "max_in_flight are waiting to be handed out, finished or not: an unbounded map reads a whole "
                        "epoch (or an endless stream) into memory"
                    )
                if received == 40:
                    _close(results)
                    break
        except PartFailed:
            raise
        except Exception as exc:
            raise PartFailed(f"{ctx.name}(function, 2000 items, {_options(options)}) raised {describe(exc)}") from exc
    return "never more than max_in_flight items taken from the input and not yet handed out, also behind a slow item"


class _Corrupt(ValueError):
    pass


_FAILING = "sample-013"


#: The item just before the failing one, and how long it takes: the failure is known well before
#: its result, whatever the machine's load, so a map that raises before handing out the results
#: ahead of the failing item is caught every time.
_SLOW_BEFORE_FAILING, SLOW_BEFORE_FAILING_S = "sample-012", 0.5


def _fails_on_13(item):
    if item == _FAILING:
        raise _Corrupt("cannot decode: the file is truncated")
    time.sleep(SLOW_BEFORE_FAILING_S if item == _SLOW_BEFORE_FAILING else 0.001)
    return item.upper()


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it keeps: its cause, or its context unless suppressed (``from None``)."""
    out = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
    return out


def _errors_name_the_item(ctx: Context) -> str:
    items = [f"sample-{i:03d}" for i in range(30)]
    before = [item.upper() for item in items[: items.index(_FAILING)]]
    received = []
    try:
        for result in ctx.candidate(_fails_on_13, iter(items), threads=2, max_in_flight=4):
            received.append(result)
    except Exception as exc:  # noqa: BLE001 - any exception type is fine, if it says what failed
        chain = _chain(exc)
        texts = [str(exc), *getattr(exc, "__notes__", [])]
        if not any(_FAILING in text for text in texts):
            raise PartFailed(f"the error does not name the item that failed ({_FAILING!r}) in its message: "
                             f"{describe(exc)}") from exc
        if not any(isinstance(e, _Corrupt) for e in chain):
            raise PartFailed(
                f"the error names the item but lost the original exception (_Corrupt: cannot decode ...): raise "
                f"yours `from` it, so the caller sees both. Got {describe(exc)}"
            ) from exc
        if received != before:
            raise PartFailed(
                f"the error came after {len(received)} results; the {len(before)} results of the items before "
                f"{_FAILING!r} must come first, in order, and then the error (a loader delivers what it can, in order)"
            ) from exc
        return f"the results before the failing item, then an error naming it, with the original kept"
    raise PartFailed(f"item {_FAILING!r} failed, but no exception reached the caller ({len(received)} results): "
                     "a failure must not be swallowed or turned into a missing or empty result")


def _new_threads(before: set) -> list[str]:
    """Threads started since ``before`` that are still alive after :data:`THREAD_GRACE` seconds."""
    deadline = time.monotonic() + THREAD_GRACE
    while True:
        alive = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not alive or time.monotonic() > deadline:
            return [t.name for t in alive]
        time.sleep(0.02)


class _Started:
    """Counts the calls that have started their long wait, so a part can hold one call until others run,
    and those still in it, so a part can tell whether any call outlived the map."""

    def __init__(self):
        self.count = 0
        self.running = 0
        self.changed = threading.Condition()

    def one_more(self) -> None:
        with self.changed:
            self.count += 1
            self.running += 1
            self.changed.notify_all()

    def long_call(self) -> None:
        """The long wait of one call, counted from its start to its end."""
        self.one_more()
        try:
            time.sleep(SLOW_CALL)
        finally:
            with self.changed:
                self.running -= 1

    def wait_for(self, count: int, timeout: float = 2.0) -> None:
        """Until ``count`` calls have started (or ``timeout`` passed: a map that runs one call at a time)."""
        with self.changed:
            self.changed.wait_for(lambda: self.count >= count, timeout)


def _fails_while_others_run():
    """A function whose item 13 fails once two later items have started their long calls."""
    started = _Started()

    def function(item):
        if item == 13:
            started.wait_for(2)
            raise _Corrupt("cannot decode")
        if item > 13:
            started.long_call()
        return item

    function.started = started
    return function


def _slow_after_the_first():
    """A function whose first call returns once two others have started their long calls."""
    started = _Started()

    def function(item):
        if item == 0:
            started.wait_for(2)
            return item
        started.long_call()
        return item

    function.started = started
    return function


def _run_to_the_end(results) -> None:
    for _ in results:
        pass


def _run_into_the_error(results) -> None:
    try:
        _run_to_the_end(results)
    except Exception:  # noqa: BLE001 - the error itself is another part's business
        pass


def _stop_after_one(results) -> None:
    next(iter(results))
    _close(results)


#: When the part counts the threads: (when, a maker of the function, items, max_in_flight, how the map is used).
_LEAK_CASES = [
    ("after a complete run", lambda: _sleepy, 20, 4, _run_to_the_end),
    ("after an item failed (while later items were still being computed)", _fails_while_others_run, 18, 4,
     _run_into_the_error),
    ("after the caller stopped early (close()) while calls were running", _slow_after_the_first, 1000, 6,
     _stop_after_one),
    ("after a map that was never iterated was closed", _slow_after_the_first, 100, 6, _close),
]


def _no_thread_left_behind(ctx: Context) -> str:
    leaks = []
    for when, make, count, max_in_flight, use in _LEAK_CASES:
        before = set(threading.enumerate())
        function = make()
        try:
            results = ctx.candidate(function, iter(range(count)), threads=3, max_in_flight=max_in_flight)
            use(results)
            # Counted the moment the map has ended, raised or closed, before anything else runs: a
            # map that waits for its threads has no call left running, whatever the machine's load.
            outlived = getattr(getattr(function, "started", None), "running", 0)
            del results
        except Exception as exc:
            raise PartFailed(f"{when}: {ctx.name}(function, {count} items, ...) raised {describe(exc)}") from exc
        gc.collect()
        names = _new_threads(before)
        if names:
            leaks.append(f"{when}: {len(names)} thread(s) still alive {THREAD_GRACE:g} s later ({', '.join(names[:3])})")
        elif outlived:
            leaks.append(f"{when}: {outlived} call(s) of the function were still running when the map had already "
                         "returned; their threads went on without anyone waiting for them")
    if leaks:
        raise PartFailed("\n".join(leaks) + "\nShut the threads down and wait for them (executor.shutdown(wait=True), "
                         "which leaving a `with` block does) before the generator ends, raises or closes")
    return "every thread has ended when the generator ends, raises, or is closed early"


register(
    "parallel_map", "07_parallel_map",
    "An order-preserving parallel map over a thread pool, bounded, with errors that name the item",
    "parallel_map(function, items, threads=2, max_in_flight=4) -> generator of function(item), in order",
    dict,
    [
        ("in order", "results come in the order of the items, each exactly once",
         "keep the submitted work in a queue in input order (collections.deque) and always wait for the oldest",
         _in_order),
        ("any items", "any iterable, with items that repeat, are None, falsy or unhashable; results that are None",
         "iterate with iter(items)/next(); keep (item, future) pairs in a deque rather than keying anything by the "
         "item, and use None as the end marker of neither the input nor the results",
         _any_items),
        ("in parallel", "calls run on `threads` threads at once, never more",
         "submit to a concurrent.futures.ThreadPoolExecutor(max_workers=threads) and collect results later, "
         "instead of calling the function and waiting for it",
         _in_parallel),
        ("bounded", "at most max_in_flight items are taken from the input and not yet handed out",
         "take the next item from the input only while fewer than max_in_flight are pending (finished or not); "
         "never list(items) or executor.map(function, items)",
         _bounded),
        ("errors name the item", "a failing call raises, after the results before it, an error naming its item "
         "that keeps the original",
         "catch the exception from future.result() and raise a new one whose message includes repr(item), "
         "`from` the original",
         _errors_name_the_item),
        ("no thread left behind", "no thread is left running after the end, an error, or an early close()",
         "create the executor in a `with` block inside the generator: leaving the block, for any reason, "
         "shuts it down and waits for its threads; cancel the pending futures in a `finally`",
         _no_thread_left_behind),
    ],
)
