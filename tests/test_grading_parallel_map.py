"""Exercise 7's check can fail: wrong parallel maps fail the part that names their mistake, and only that one.

Each wrong implementation breaks one promise of the exercise's text, the way people do
when they write this in a hurry: results in completion order; results keyed by item
(repeated or unhashable items), ``None`` taken for the end of the input or of the results,
``next()`` on a list; a pool of the wrong size, or no pool; every item taken at once, a refill whenever a
call finishes, one item read ahead; a failing item dropped, an error that does not say
which item, one that drops the original, one that arrives before the results ahead of
it; threads left running after an error or an early close, or by a map that starts work
before it is iterated. ``test_the_mistakes_are_real``
shows each mistake outside the grader. Correct alternatives, written differently from the
solution notebook, must pass every part. The solution itself and the untouched stub are
checked by tests/test_exercises.py (full marks, and zero).
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import pytest

from grading_support import Failed, failed_parts as run_check


PARTS = {"in order", "any items", "in parallel", "bounded", "errors name the item", "no thread left behind"}


def failed_parts(candidate) -> Failed:
    failed = run_check("parallel_map", candidate)
    assert set(failed.parts) == PARTS
    return failed


def _named(item, exc):
    return RuntimeError(f"item {item!r} failed: {exc}")


def _ordered(function, items, threads, max_in_flight, *, start=iter, take=next, pool_size=None, on_error=None,
             shutdown="with"):
    """The right map with pieces replaceable: how the input is read, pool size, error handling, how to shut down."""
    source = start(items)
    pool = ThreadPoolExecutor(pool_size(threads, max_in_flight) if pool_size else threads)
    pending = collections.deque()
    try:
        while True:
            while len(pending) < max_in_flight:
                try:
                    item = take(source)
                except StopIteration:
                    break
                pending.append((item, pool.submit(function, item)))
            if not pending:
                break
            item, future = pending.popleft()
            try:
                result = future.result()
            except Exception as exc:
                if on_error is None:
                    raise _named(item, exc) from exc
                outcome = on_error(item, exc)
                if outcome is _SKIP:
                    continue
                raise outcome
            yield result
    finally:
        for _, future in pending:
            future.cancel()
        if shutdown == "with":
            pool.shutdown(wait=True)
        elif shutdown == "no wait":
            pool.shutdown(wait=False, cancel_futures=True)
    if shutdown == "at the end only":
        pool.shutdown(wait=True)


_SKIP = object()


# ------------------------------------------------------------------ wrong implementations


def completion_order_map(function, items, threads=2, max_in_flight=4):
    """Yields whatever finishes first: bounded and parallel, but the order is lost."""
    source = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        pending = {}
        try:
            while True:
                for item in itertools.islice(source, max_in_flight - len(pending)):
                    pending[pool.submit(function, item)] = item
                if not pending:
                    return
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    item = pending.pop(future)
                    try:
                        result = future.result()
                    except Exception as exc:
                        raise _named(item, exc) from exc
                    yield result
        finally:
            for future in pending:
                future.cancel()


def keyed_by_item_map(function, items, threads=2, max_in_flight=4):
    """Keeps the futures in a dict keyed by item: a repeated item overwrites the first, an unhashable one raises."""
    source = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        futures = {}
        order = collections.deque()
        try:
            while True:
                for item in itertools.islice(source, max_in_flight - len(order)):
                    if item not in futures:
                        futures[item] = pool.submit(function, item)
                        order.append(item)
                if not order:
                    return
                item = order.popleft()
                try:
                    result = futures.pop(item).result()
                except Exception as exc:
                    raise _named(item, exc) from exc
                yield result
        finally:
            for future in futures.values():
                future.cancel()


def none_ends_the_input_map(function, items, threads=2, max_in_flight=4):
    """Uses next(source, None) and takes None for the end of the input."""
    ended = False

    def take(source):
        nonlocal ended
        item = None if ended else next(source, None)
        if item is None:
            ended = True
            raise StopIteration
        return item

    return _ordered(function, items, threads, max_in_flight, take=take)


def none_result_ends_the_output_map(function, items, threads=2, max_in_flight=4):
    """Stops at the first result that is None, as a results queue with None for its end marker does."""
    for result in _ordered(function, items, threads, max_in_flight):
        if result is None:
            return
        yield result


def next_on_the_items_map(function, items, threads=2, max_in_flight=4):
    """Calls next() on `items` itself: right for the generators it was tried on, a TypeError for a list."""
    return _ordered(function, items, threads, max_in_flight, start=lambda items: items)


def default_pool_map(function, items, threads=2, max_in_flight=4):
    """ThreadPoolExecutor() without max_workers: as many threads as Python picks (cores + 4), not `threads`."""
    return _ordered(function, items, threads, max_in_flight, pool_size=lambda threads, in_flight: None or 32)


def pool_of_max_in_flight_map(function, items, threads=2, max_in_flight=4):
    """Sizes the pool by max_in_flight: every item in flight runs at once."""
    return _ordered(function, items, threads, max_in_flight, pool_size=lambda threads, in_flight: in_flight)


def serial_map(function, items, threads=2, max_in_flight=4):
    """No threads at all: correct, bounded, and as slow as a plain loop."""
    for item in items:
        try:
            result = function(item)
        except Exception as exc:
            raise _named(item, exc) from exc
        yield result


def unbounded_map(function, items, threads=2, max_in_flight=4):
    """Submits every item at once: an epoch (or an endless stream) ends up in memory."""
    with ThreadPoolExecutor(threads) as pool:
        futures = [(item, pool.submit(function, item)) for item in items]
        try:
            for item, future in futures:
                try:
                    result = future.result()
                except Exception as exc:
                    raise _named(item, exc) from exc
                yield result
        finally:
            for _, future in futures:
                future.cancel()


def refill_when_a_call_finishes_map(function, items, threads=2, max_in_flight=4):
    """Bounds the calls *running*, not the items taken: finished results pile up behind a slow first item."""
    source = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        order = collections.deque()
        running = set()
        try:
            while True:
                for item in itertools.islice(source, max_in_flight - len(running)):
                    future = pool.submit(function, item)
                    order.append((item, future))
                    running.add(future)
                if not order:
                    return
                if not order[0][1].done():
                    _, running = wait(running, return_when=FIRST_COMPLETED)
                    continue
                item, future = order.popleft()
                running.discard(future)
                try:
                    result = future.result()
                except Exception as exc:
                    raise _named(item, exc) from exc
                yield result
        finally:
            for _, future in order:
                future.cancel()


def feeder_thread_map(function, items, threads=2, max_in_flight=4):
    """A thread that copies the input into an unbounded queue.Queue: it reads everything as fast as it can."""

    def fed(items):
        inbox, end = queue.Queue(), object()
        threading.Thread(target=lambda: [inbox.put(item) for item in [*items, end]], daemon=True).start()
        return iter(inbox.get, end)

    return _ordered(function, items, threads, max_in_flight, start=fed)


def swallowing_map(function, items, threads=2, max_in_flight=4):
    """Skips an item whose call failed, so a corrupt sample silently disappears."""
    return _ordered(function, items, threads, max_in_flight, on_error=lambda item, exc: _SKIP)


def anonymous_error_map(function, items, threads=2, max_in_flight=4):
    """Re-raises the original exception: the caller learns that something failed, not which item."""
    return _ordered(function, items, threads, max_in_flight, on_error=lambda item, exc: exc)


def original_dropped_map(function, items, threads=2, max_in_flight=4):
    """Names the item but raises `from None`: the original exception, and where it came from, are gone."""

    def replace(item, exc):
        error = RuntimeError(f"item {item!r} failed")
        error.__suppress_context__ = True  # what `raise ... from None` does
        return error

    return _ordered(function, items, threads, max_in_flight, on_error=replace)


def error_first_map(function, items, threads=2, max_in_flight=4):
    """Raises as soon as any call fails, before handing out the results of the items ahead of it."""
    source = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        pending = collections.deque()
        try:
            while True:
                for item in itertools.islice(source, max_in_flight - len(pending)):
                    pending.append((item, pool.submit(function, item)))
                if not pending:
                    return
                wait([future for _, future in pending], return_when=FIRST_COMPLETED)
                for item, future in pending:
                    if future.done() and future.exception() is not None:
                        raise _named(item, future.exception()) from future.exception()
                if pending[0][1].done():
                    yield pending.popleft()[1].result()
        finally:
            for _, future in pending:
                future.cancel()


def leaky_map(function, items, threads=2, max_in_flight=4):
    """Its own worker threads, stopped with sentinels only when every item is done: an error or an
    early close leaves them blocked on the input queue for good."""
    tasks, done = queue.Queue(), {}
    finished = threading.Condition()

    def work():
        while (task := tasks.get()) is not None:
            number, item = task
            try:
                outcome = (True, function(item))
            except Exception as exc:
                outcome = (False, exc)
            with finished:
                done[number] = outcome
                finished.notify_all()

    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    numbered = enumerate(items)
    sent = received = 0
    keyed = {}
    for number, item in itertools.islice(numbered, max_in_flight):
        keyed[number] = item
        tasks.put((number, item))
        sent += 1
    while received < sent:
        with finished:
            finished.wait_for(lambda: received in done)
            ok, value = done.pop(received)
        item = keyed.pop(received)
        received += 1
        if not ok:
            raise _named(item, value) from value
        for number, nxt in itertools.islice(numbered, 1):
            keyed[number] = nxt
            tasks.put((number, nxt))
            sent += 1
        yield value
    for _ in workers:
        tasks.put(None)


def shutdown_without_waiting_map(function, items, threads=2, max_in_flight=4):
    """Shuts the pool down with wait=False: the calls still running go on after the generator has gone."""
    return _ordered(function, items, threads, max_in_flight, shutdown="no wait")


def shutdown_at_the_end_only_map(function, items, threads=2, max_in_flight=4):
    """Shuts the pool down after the loop, not in a `finally`: an error or an early close skips it."""
    return _ordered(function, items, threads, max_in_flight, shutdown="at the end only")


def eager_start_map(function, items, threads=2, max_in_flight=4):
    """Starts the work when called, not when first iterated: a map created and closed unused leaves threads running."""
    source = iter(items)
    pool = ThreadPoolExecutor(threads)
    pending = collections.deque((item, pool.submit(function, item)) for item in itertools.islice(source, max_in_flight))

    def results():
        with pool:
            try:
                while pending:
                    item, future = pending.popleft()
                    try:
                        result = future.result()
                    except Exception as exc:
                        raise _named(item, exc) from exc
                    for following in itertools.islice(source, 1):
                        pending.append((following, pool.submit(function, following)))
                    yield result
            finally:
                for _, future in pending:
                    future.cancel()

    return results()


ALL = set(PARTS)
WRONG = {
    completion_order_map: {"in order", "any items", "errors name the item"},  # the results before the error come out of order too
    keyed_by_item_map: {"any items"},
    none_ends_the_input_map: {"any items"},
    none_result_ends_the_output_map: {"any items"},
    next_on_the_items_map: {"any items"},
    default_pool_map: {"in parallel"},
    pool_of_max_in_flight_map: {"in parallel"},
    serial_map: {"in parallel"},
    unbounded_map: {"bounded"},
    refill_when_a_call_finishes_map: {"bounded"},
    feeder_thread_map: {"bounded"},
    swallowing_map: {"errors name the item"},
    anonymous_error_map: {"errors name the item"},
    original_dropped_map: {"errors name the item"},
    error_first_map: {"errors name the item"},
    leaky_map: {"no thread left behind"},
    shutdown_without_waiting_map: {"no thread left behind"},
    shutdown_at_the_end_only_map: {"no thread left behind"},
    eager_start_map: {"no thread left behind"},
}


@pytest.mark.parametrize("candidate", WRONG, ids=lambda c: c.__name__)
def test_each_wrong_parallel_map_fails_the_part_that_names_its_mistake(candidate):
    assert failed_parts(candidate) == WRONG[candidate]


# ------------------------------------------------------- evidence outside the grader


def _peak(candidate, threads, max_in_flight, count=8):
    lock, state = threading.Lock(), {"running": 0, "peak": 0}

    def slow(item):
        with lock:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
        time.sleep(0.05)
        with lock:
            state["running"] -= 1
        return item

    list(candidate(slow, range(count), threads=threads, max_in_flight=max_in_flight))
    return state["peak"]


def _taken_when_first_arrives(candidate, max_in_flight):
    taken = []

    def source():
        for item in range(100):
            taken.append(item)
            yield item

    results = candidate(lambda item: time.sleep(0.2 if item == 0 else 0) or item, source(), threads=3,
                        max_in_flight=max_in_flight)
    next(results)
    results.close()
    return len(taken)


def _raised(candidate, items, function):
    received = []
    try:
        for result in candidate(function, items, threads=2, max_in_flight=3):
            received.append(result)
    except Exception as exc:  # noqa: BLE001
        return received, exc
    return received, None


def _threads_after_close(candidate):
    before = set(threading.enumerate())
    results = candidate(lambda item: time.sleep(0.1 if item == 0 else 0.5) or item, iter(range(100)), threads=3,
                        max_in_flight=6)
    next(results)
    results.close()
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_the_mistakes_are_real():
    """Each mistake shown without the grader: plain calls, and what comes back."""
    delays = {0: 0.05, 1: 0.0, 2: 0.02, 3: 0.0}
    slowish = lambda item: time.sleep(delays[item]) or item  # noqa: E731
    assert list(completion_order_map(slowish, range(4), threads=4, max_in_flight=4)) != [0, 1, 2, 3]
    assert list(keyed_by_item_map(str, [1, 1, 2], threads=2)) == ["1", "2"]
    with pytest.raises(TypeError, match="unhashable"):
        list(keyed_by_item_map(str, [[1]], threads=2))
    assert list(none_ends_the_input_map(str, [1, None, 2], threads=2)) == ["1"]  # not ["1", "None", "2"]
    assert list(none_result_ends_the_output_map(lambda item: item or None, [1, 0, 2], threads=2)) == [1]  # not [1, None, 2]
    with pytest.raises(TypeError, match="not an iterator"):
        list(next_on_the_items_map(str, [1, 2], threads=2))
    assert _peak(default_pool_map, threads=2, max_in_flight=8) > 2
    assert _peak(pool_of_max_in_flight_map, threads=2, max_in_flight=8) == 8
    assert _peak(serial_map, threads=2, max_in_flight=8) == 1
    assert _taken_when_first_arrives(unbounded_map, max_in_flight=4) == 100
    assert _taken_when_first_arrives(refill_when_a_call_finishes_map, max_in_flight=4) > 10
    assert _taken_when_first_arrives(feeder_thread_map, max_in_flight=4) == 100

    def fails_on_2(item):
        if item == 2:
            raise KeyError("broken")
        time.sleep(0.05 if item < 2 else 0)
        return item

    assert _raised(swallowing_map, range(5), fails_on_2) == ([0, 1, 3, 4], None)
    received, error = _raised(anonymous_error_map, range(5), fails_on_2)
    assert isinstance(error, KeyError) and "2" not in str(error).replace("broken", "")
    received, error = _raised(original_dropped_map, range(5), fails_on_2)
    assert error.__cause__ is None and error.__suppress_context__
    received, error = _raised(error_first_map, range(5), fails_on_2)
    assert received == [] and error is not None  # items 0 and 1 were fine, and never arrived
    assert _raised(_ordered, range(5), fails_on_2)[0] == [0, 1]  # the right way round, for comparison
    for candidate in (leaky_map, shutdown_without_waiting_map, shutdown_at_the_end_only_map):
        assert _threads_after_close(candidate), candidate.__name__
    assert not _threads_after_close(_ordered)
    before = set(threading.enumerate())
    eager_start_map(lambda item: time.sleep(0.5), range(10), threads=2).close()  # created, never used
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()]


# ------------------------------------------------------------------ correct alternatives


def threads_and_queues_map(function, items, threads=2, max_in_flight=4):
    """Written without concurrent.futures: worker threads, a task queue, numbered results, a stop signal."""
    tasks, results = queue.Queue(), {}
    ready = threading.Condition()
    stop = threading.Event()

    def work():
        while not stop.is_set():
            try:
                task = tasks.get(timeout=0.05)
            except queue.Empty:
                continue
            number, item = task
            try:
                outcome = (True, function(item))
            except Exception as exc:
                outcome = (False, exc)
            with ready:
                results[number] = (item, outcome)
                ready.notify_all()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        numbered = enumerate(items)
        sent = next_out = 0
        for number, item in itertools.islice(numbered, max_in_flight):
            tasks.put((number, item))
            sent += 1
        while next_out < sent:
            with ready:
                ready.wait_for(lambda: next_out in results)
                item, (ok, value) = results.pop(next_out)
            next_out += 1
            if not ok:
                raise RuntimeError(f"parallel map: {item!r} failed") from value
            for number, nxt in itertools.islice(numbered, 1):
                tasks.put((number, nxt))
                sent += 1
            yield value
    finally:
        stop.set()
        for worker in workers:
            worker.join()


def chunked_executor_map(function, items, threads=2, max_in_flight=4):
    """Executor.map over one chunk of max_in_flight items at a time: simpler, a little less busy at chunk ends."""
    source = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        while chunk := list(itertools.islice(source, max_in_flight)):
            futures = [pool.submit(function, item) for item in chunk]
            try:
                for item, future in zip(chunk, futures):
                    try:
                        yield future.result()
                    except Exception as exc:
                        raise ValueError(f"{function.__name__} failed on {item}: {exc}") from exc
            finally:
                for future in futures:
                    future.cancel()


def noted_original_map(function, items, threads=2, max_in_flight=4):
    """Raises the original exception itself, with a note naming the item; futures and items in two deques."""
    source = iter(items)
    waiting_items, futures = collections.deque(), collections.deque()
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pmap")
    try:
        for item in source:
            waiting_items.append(item)
            futures.append(pool.submit(function, item))
            if len(futures) < max_in_flight:
                continue
            while len(futures) >= max_in_flight:
                yield _result_or_noted(waiting_items.popleft(), futures.popleft())
        while futures:
            yield _result_or_noted(waiting_items.popleft(), futures.popleft())
    finally:
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True)


def _result_or_noted(item, future):
    try:
        return future.result()
    except Exception as exc:
        exc.add_note(f"while computing item {item!r}")
        raise


@pytest.mark.parametrize("candidate", [threads_and_queues_map, chunked_executor_map, noted_original_map],
                         ids=lambda c: c.__name__)
def test_correct_alternatives_pass_every_part(candidate):
    assert failed_parts(candidate) == set()
