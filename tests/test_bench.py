"""The timing harness counts what it should and refuses to report nonsense."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from packlab.bench import (
    BenchResult,
    BenchTable,
    Spread,
    batch_size_of,
    compare,
    ratio_words,
    interleaved,
    run_until_error,
    time_loader,
    time_per_item,
)


def _loader(n=50, batch_size=8):
    return DataLoader(TensorDataset(torch.zeros(n, 3), torch.arange(n)), batch_size=batch_size)


def test_time_loader_counts_images_per_epoch():
    result = time_loader(_loader(50, 8), epochs=3, name="toy", bytes_per_epoch=5_000_000)
    assert result.images_per_epoch == 50
    assert len(result.epoch_seconds) == 3
    assert result.images_per_s == pytest.approx(150 / sum(result.epoch_seconds))
    assert result.mb_per_s == pytest.approx(15 / sum(result.epoch_seconds))
    assert 0 <= result.first_batch_seconds <= result.epoch_seconds[0]


def test_on_batch_runs_inside_the_timed_region():
    result = time_loader(_loader(20, 10), epochs=1, on_batch=lambda batch: time.sleep(0.05))
    assert result.epoch_seconds[0] >= 0.1


def test_batch_size_of_understands_common_batch_shapes():
    assert batch_size_of((torch.zeros(4, 3), torch.zeros(4))) == 4
    assert batch_size_of([torch.zeros(5, 2), torch.zeros(5), ["a"] * 5]) == 5
    assert batch_size_of({"image": torch.zeros(6, 1)}) == 6
    assert batch_size_of(torch.zeros(7, 3)) == 7
    assert batch_size_of([1, 2, 3]) == 3


def test_epochs_of_different_length_are_an_error():
    class Shrinking:
        def __init__(self):
            self.n = 3

        def __iter__(self):
            self.n -= 1
            return iter([torch.zeros(2, 1)] * self.n)

    with pytest.raises(RuntimeError, match="different numbers"):
        time_loader(Shrinking(), epochs=2)


def test_an_empty_loader_is_an_error():
    with pytest.raises(RuntimeError, match="no samples"):
        time_loader([], epochs=1)
    with pytest.raises(ValueError):
        time_loader(_loader(), epochs=0)


def test_results_print_as_a_table():
    a = BenchResult("folder, 0 workers", [2.0, 1.0], 300, 0.1, bytes_per_epoch=30_000_000)
    b = BenchResult("zip, 2 workers", [1.0, 0.5], 300, 0.3)
    text = str(BenchTable([a, b]))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["loader", "epochs", "s/epoch"]
    assert "folder, 0 workers" in lines[2] and "200" in lines[2] and "20.0" in lines[2]
    assert "zip, 2 workers" in lines[3] and "400" in lines[3]
    assert "<table>" in a._repr_html_() and "folder, 0 workers" in a._repr_html_()
    assert str(a).splitlines()[0] == lines[0]
    assert a.to_dict()["images_per_s"] == pytest.approx(200)


def test_time_per_item_is_per_item():
    seconds = time_per_item(lambda x: time.sleep(0.01), range(5), repeat=2)
    assert 0.009 <= seconds < 0.05


def test_run_until_error_returns_the_error_and_the_batches_before_it():
    class FailsAtThree(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            if index == 3:
                raise ValueError("sample 3 is broken")
            return torch.zeros(1)

    batches, error = run_until_error(DataLoader(FailsAtThree(), batch_size=1))
    assert batches == 3 and isinstance(error, ValueError) and "sample 3" in str(error)
    assert run_until_error(_loader(10, 5)) == (2, None)


def test_the_benchmark_writes_every_ratio_and_a_plot(small_root, tmp_path):
    import json
    import shutil

    from packlab.bench import format_benchmark, run_benchmark

    root = tmp_path / "data"
    shutil.copytree(small_root, root)
    lines = []
    results = run_benchmark(root=root, worker_counts=[0, 2], out_dir=tmp_path / "out", log=lines.append)
    written = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert (tmp_path / "out" / "bench.png").stat().st_size > 0
    for name in ("zip_vs_ceiling", "tar_vs_ceiling", "tar_vs_webdataset"):
        assert written["ratios"][name] > 0
    assert written["ceiling_images_per_s_per_core"] > 0
    loaders = {r["loader"] for r in written["runs"]}
    assert {"JPEG folder", "zip, per-worker handle", "tar shards (ours)", "webdataset"} <= loaders
    assert all(r["workers"] in (0, 2) for r in written["runs"])
    assert written["small_files"]["modelled_files_per_s"]["tar"] > 0
    assert "decode ceiling" in format_benchmark(results) and any("ratios" in line for line in lines)


def test_interleaved_runs_take_turns_and_spreads_summarise_them():
    order = []
    results = interleaved({"a": lambda: order.append("a") or 1.0, "b": lambda: order.append("b") or 2.0}, repeats=3)
    assert order == ["a", "b"] * 3
    assert results == {"a": [1.0] * 3, "b": [2.0] * 3}
    spread = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (spread.median, spread.low, spread.high) == (2.5, 1.0, 10.0)
    assert Spread.of([5, 1, 3]).format(".1f") == "3.0 (1.0\u20135.0)"
    with pytest.raises(ValueError):
        Spread.of([])


def test_compare_says_no_clear_difference_when_ranges_overlap():
    assert compare(Spread.of([10, 11, 12]), Spread.of([1, 2, 3])) == 1
    assert compare(Spread.of([1, 2, 3]), Spread.of([10, 11, 12])) == -1
    assert compare(Spread.of([1, 5, 9]), Spread.of([4, 6, 8])) == 0
    assert compare(Spread.of([1, 2, 3]), Spread.of([3, 4, 5])) == 0  # touching ranges overlap
    assert ratio_words(Spread.of([30, 31, 32]), Spread.of([10, 11, 12])) == "2.8 times faster"
    assert ratio_words(Spread.of([10, 11, 12]), Spread.of([30, 31, 32]), "larger", "smaller") == "2.8 times smaller"
    assert ratio_words(Spread.of([1, 5, 9]), Spread.of([4, 6, 8])) == "no clear difference"
