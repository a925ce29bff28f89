"""The consumer of chapter 7: the tiny CNN, its training step, and the step log."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch

from packlab import bench, plots, train


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread, as in a DataLoader worker: with the default (one per core), tiny
    convolutions on a machine whose cores are busy spend most of their time in thread barriers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _batches(n_batches=3, size=4, side=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.rand(size, 3, side, side, generator=generator), torch.randint(0, 10, (size,), generator=generator))
        for _ in range(n_batches)
    ]


def test_tiny_cnn_gives_one_score_per_class_and_rejects_other_shapes():
    model = train.TinyCNN()
    assert model(torch.zeros(2, 3, 256, 256)).shape == (2, 10)
    assert 10_000 < train.count_parameters(model) < 100_000
    with pytest.raises(ValueError, match="N x 3 x H x W"):
        model(torch.zeros(3, 256, 256))


def test_train_step_changes_the_weights_and_evaluate_restores_the_mode():
    torch.manual_seed(0)
    model = train.TinyCNN(pool=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    images, labels = _batches(1)[0]
    loss = train.train_step(model, optimizer, images, labels.tolist())
    assert loss > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert 0.0 <= train.evaluate(model, _batches(2)) <= 1.0
    assert model.training  # evaluate() switched to eval mode and back
    with pytest.raises(ValueError, match="no samples"):
        train.evaluate(model, [])


def test_training_consumer_logs_a_wait_and_a_step_per_batch():
    model = train.TinyCNN(pool=1)
    consumer = train.TrainingConsumer(model, torch.optim.SGD(model.parameters(), lr=0.01))
    with pytest.raises(RuntimeError, match="start_clock"):
        consumer.intervals()
    consumer.start_clock()
    result = bench.time_loader(_batches(3), epochs=2, on_batch=consumer)
    intervals = consumer.intervals()
    assert result.images_per_epoch == 12 and len(intervals) == 6 and len(consumer.losses) == 6
    assert all(wait >= 0 and compute > 0 for wait, compute in intervals)
    assert consumer.compute_images_per_s() > 0
    consumer.start_clock()  # a new run forgets the old one
    assert consumer.intervals() == []


def test_step_timeline_draws_waits_and_steps_on_a_time_axis():
    fig = plots.plot_step_timeline({"0 workers": [(0.2, 0.1), (0.2, 0.1)], "2 workers": [(0.3, 0.1), (0.01, 0.1)]})
    ax = fig.axes[0]
    assert "(s)" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0 workers", "2 workers"]
    assert len(ax.collections) == 4  # waits and steps, per row
    plt.close(fig)
