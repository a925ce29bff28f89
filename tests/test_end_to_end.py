"""Chapter 11's end-to-end measurement runs in a fresh process: results and errors come back, settings carry over."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from packlab import end_to_end


def _where_and_threads(value):
    import torch

    return value * 2, os.getpid(), torch.get_num_threads()


def _loaded(name):
    return name in sys.modules


def _fails():
    raise ValueError("shard 7 is truncated")


def test_a_function_runs_in_a_fresh_process_with_the_caller_s_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with end_to_end.FreshProcess(modules=()) as process:
            doubled, pid, threads = process.run(_where_and_threads, 21)
    finally:
        torch.set_num_threads(before)
    assert doubled == 42 and pid != os.getpid() and threads == 1


def test_a_process_started_early_has_its_imports_done_and_keeps_its_pid_between_runs():
    # The chapter starts it at the top so that the imports overlap its set-up; what it ran first is still there.
    with end_to_end.FreshProcess(modules=("packlab.ceiling",)) as process:
        assert process.ready() >= 0
        assert process.run(_loaded, "packlab.ceiling")
        assert not process.run(_loaded, "packlab.store_cache")  # spawn: nothing inherited from this process
        first, second = process.run(_where_and_threads, 1)[1], process.run(_where_and_threads, 2)[1]
    assert first == second != os.getpid()


def test_an_error_in_the_fresh_process_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="shard 7 is truncated"):
        with end_to_end.FreshProcess(modules=()) as process:
            process.run(_fails)


def test_a_run_after_close_starts_a_new_process():
    # An attendee runs "All together" a second time, after its cell closed the process.
    process = end_to_end.FreshProcess(modules=())
    first = process.run(_where_and_threads, 1)[1]
    process.close()
    try:
        second = process.run(_where_and_threads, 2)[1]
    finally:
        process.close()
    assert second not in (first, os.getpid())
