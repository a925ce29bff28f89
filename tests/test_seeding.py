"""Random augmentation in workers: which guarantees hold, the copied-Generator bug, and its fixes."""

from __future__ import annotations

import pytest

from packlab import seeding

TORCH, COPIED, PER_WORKER, PER_SAMPLE = seeding.AugmentationDraws.SOURCES


def _draws(records):
    return [draw for _, _, draw in records]


def test_torch_seeds_each_worker_differently_and_reproducibly():
    first = seeding.draws(TORCH, 2)
    assert len(set(seeding.first_draw_per_worker(first).values())) == 2
    assert first == seeding.draws(TORCH, 2)


def test_another_worker_count_gives_other_crops_unless_drawn_per_sample():
    assert _draws(seeding.draws(TORCH, 2)) != _draws(seeding.draws(TORCH, 3))
    per_sample = [_draws(seeding.draws(PER_SAMPLE, workers)) for workers in (0, 2, 3)]
    assert per_sample[0] == per_sample[1] == per_sample[2]


def test_without_a_seeded_generator_runs_differ():
    assert seeding.draws(TORCH, 2, loader_seed=None) != seeding.draws(TORCH, 2, loader_seed=None)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_generator_made_in_init_is_copied_into_every_worker(method):
    first = seeding.first_draw_per_worker(seeding.draws(COPIED, 2, method=method))
    assert first[0] == first[1], "both workers should draw the same crop first: the generator was copied"


def test_remaking_the_generator_in_each_worker_fixes_it_reproducibly():
    records = seeding.draws(PER_WORKER, 2)
    first = seeding.first_draw_per_worker(records)
    assert first[0] != first[1] and records == seeding.draws(PER_WORKER, 2)
