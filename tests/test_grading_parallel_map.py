"""Exercise 7's check can fail: wrong parallel maps fail the part that names their mistake, and only that one.

Each wrong implementation makes one mistake people make when they write this: taking
every item at once (unbounded), yielding in completion order (lost order), dropping a
failing item (swallowed exception), raising without saying which item failed, running
everything in the caller's thread (serial), or never stopping its threads on an error or
an early close (leaked threads). Two correct alternatives, written differently from the
solution notebook, must pass every part. The solution itself and the untouched stub are
checked by tests/test_exercises.py (full marks, and zero).
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import pytest

from packlab.course.grading import check

PARTS = {"in order", "in parallel", "bounded", "errors name the item", "no thread left behind"}


def failed_parts(candidate) -> set[str]:
    result = check("parallel_map", candidate, quiet=True, record=False)
    assert {part.name for part in result.parts} == PARTS
    return {part.name for part in result.parts if not part.passed}


def _named(item, exc):
    return RuntimeError(f"item {item!r} failed: {exc}")


# ------------------------------------------------------------------ wrong implementations


def unbounded_map(function, items, threads=2, max_in_flight=4):
    """Submits every item at once: an epoch (or an endless stream) ends up in memory."""
    with ThreadPoolExecutor(threads) as pool:
        futures = [(item, pool.submit(function, item)) for item in items]
        for item, future in futures:
            try:
                result = future.result()
            except Exception as exc:
                for _, rest in futures:
                    rest.cancel()
                raise _named(item, exc) from exc
            yield result


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


def swallowing_map(function, items, threads=2, max_in_flight=4):
    """Skips an item whose call failed, so a corrupt sample silently disappears."""
    source = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        pending = collections.deque()
        try:
            while True:
                for item in itertools.islice(source, max_in_flight - len(pending)):
                    pending.append(pool.submit(function, item))
                if not pending:
                    return
                try:
                    result = pending.popleft().result()
                except Exception:
                    continue
                yield result
        finally:
            for future in pending:
                future.cancel()


def anonymous_error_map(function, items, threads=2, max_in_flight=4):
    """Re-raises the original exception: the caller learns that something failed, not which item."""
    source = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        pending = collections.deque()
        try:
            while True:
                for item in itertools.islice(source, max_in_flight - len(pending)):
                    pending.append(pool.submit(function, item))
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def serial_map(function, items, threads=2, max_in_flight=4):
    """No threads at all: correct, bounded, and as slow as a plain loop."""
    for item in items:
        try:
            result = function(item)
        except Exception as exc:
            raise _named(item, exc) from exc
        yield result


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


WRONG = {
    "unbounded_map": (unbounded_map, {"bounded"}),
    "completion_order_map": (completion_order_map, {"in order"}),
    "swallowing_map": (swallowing_map, {"errors name the item"}),
    "anonymous_error_map": (anonymous_error_map, {"errors name the item"}),
    "serial_map": (serial_map, {"in parallel"}),
    "leaky_map": (leaky_map, {"no thread left behind"}),
}


@pytest.mark.parametrize("name", WRONG)
def test_each_wrong_parallel_map_fails_the_part_that_names_its_mistake(name):
    candidate, mistakes = WRONG[name]
    assert failed_parts(candidate) == mistakes


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


@pytest.mark.parametrize("candidate", [threads_and_queues_map, chunked_executor_map])
def test_correct_alternatives_pass_every_part(candidate):
    assert failed_parts(candidate) == set()
