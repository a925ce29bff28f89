"""Generation is deterministic, verification names every bad file, and interruption is safe."""

from __future__ import annotations

import filecmp
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from packlab import data, paths


def test_manifest_describes_the_files(small_root, small_manifest):
    assert len(small_manifest) == 60
    assert [s.key for s in small_manifest] == [data.key_of(i) for i in range(60)]
    for sample in small_manifest[:10]:
        path = data.image_path(sample.key, small_root)
        assert path.stat().st_size == sample.bytes
        assert data.sha256_file(path) == sample.sha256
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert im.size == (sample.width, sample.height)
    assert data.load_labels(small_root) == {s.key: s.label for s in small_manifest}


def test_images_are_imagenet_like_in_size_and_texture(small_root, small_manifest):
    widths = [s.width for s in small_manifest]
    heights = [s.height for s in small_manifest]
    assert 250 <= min(widths + heights) and max(widths + heights) <= 500
    assert len(set(widths)) > 20, "sizes should vary"
    # Textured, not flat: plenty of pixel-to-pixel variation.
    with Image.open(data.image_path(small_manifest[0].key, small_root)) as im:
        pixels = np.asarray(im.convert("L"), dtype=np.float32)
    assert np.abs(np.diff(pixels, axis=1)).mean() > 2.0


def test_labels_are_balanced_and_not_sorted_by_key():
    labels = data.labels_for(10_000, data.DEFAULT_SEED)
    assert np.bincount(labels).tolist() == [1000] * 10
    runs = np.count_nonzero(np.diff(labels)) + 1
    assert runs > 8000, "consecutive keys should not share a class"


def test_generation_is_deterministic_whatever_the_worker_count(tmp_path, small_root):
    again = data.generate(tmp_path / "again", count=60, seed=7, workers=1, progress=False)
    assert paths.manifest_path(again).read_bytes() == paths.manifest_path(small_root).read_bytes()
    match, mismatch, errors = filecmp.cmpfiles(
        paths.images_dir(small_root), paths.images_dir(again), [f"{data.key_of(i)}.jpg" for i in range(60)], shallow=False
    )
    assert not mismatch and not errors


def test_a_different_seed_gives_different_images(tmp_path, small_manifest):
    other = data.generate(tmp_path / "other", count=60, seed=8, workers=2, progress=False)
    assert [s.sha256 for s in data.load_manifest(other)] != [s.sha256 for s in small_manifest]


@pytest.fixture
def copy_of_small(small_root, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(small_root, dst)
    return dst


def test_verify_passes_on_intact_data(small_root):
    report = data.verify(small_root)
    assert report.ok and report.checked == 60 and report.problems == []


def test_verify_names_an_altered_image(copy_of_small):
    victim = data.image_path("000017", copy_of_small)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, different content
    victim.write_bytes(bytes(raw))
    report = data.verify(copy_of_small)
    assert not report.ok
    assert report.problems == [f"altered (sha256 differs): {victim}"]


def test_verify_names_every_missing_truncated_and_unexpected_file(copy_of_small):
    data.image_path("000003", copy_of_small).unlink()
    data.image_path("000042", copy_of_small).unlink()
    truncated = data.image_path("000010", copy_of_small)
    truncated.write_bytes(truncated.read_bytes()[:100])
    (paths.images_dir(copy_of_small) / "stray.jpg").write_bytes(b"x")
    problems = "\n".join(data.verify(copy_of_small).problems)
    for name in ("000003.jpg", "000042.jpg", "000010.jpg", "stray.jpg"):
        assert name in problems


def test_verify_reports_a_missing_manifest_with_what_to_do(copy_of_small):
    paths.manifest_path(copy_of_small).unlink()
    report = data.verify(copy_of_small)
    assert not report.ok
    assert "manifest.csv" in report.problems[0] and "make data" in report.problems[0]


def test_verify_reports_labels_that_disagree(copy_of_small):
    labels = paths.labels_path(copy_of_small)
    lines = labels.read_text().splitlines()
    key, label = lines[5].split(",")
    lines[5] = f"{key},{(int(label) + 1) % 10}"
    labels.write_text("\n".join(lines) + "\n")
    problems = data.verify(copy_of_small).problems
    assert len(problems) == 1 and "labels.csv" in problems[0] and key in problems[0]


def test_cli_verify_exit_code_and_message(copy_of_small):
    cmd = [sys.executable, "-m", "packlab.data", "--root", str(copy_of_small), "--verify", "-q"]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "OK: 60 images" in ok.stdout
    data.image_path("000001", copy_of_small).unlink()
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "000001.jpg" in bad.stderr


def test_ensure_does_nothing_when_verified_and_regenerates_otherwise(copy_of_small, capsys):
    before = paths.manifest_path(copy_of_small).stat().st_mtime_ns
    data.ensure(copy_of_small, count=60, seed=7)
    assert "nothing to do" in capsys.readouterr().out
    assert paths.manifest_path(copy_of_small).stat().st_mtime_ns == before
    data.image_path("000005", copy_of_small).unlink()
    data.ensure(copy_of_small, count=60, seed=7, progress=False)
    assert data.verify(copy_of_small).ok


def test_interrupted_generation_leaves_nothing_that_verifies(tmp_path):
    root = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "packlab.data", "--root", str(root), "--count", "3000", "--force", "-q"],
        start_new_session=True,  # so the kill reaches the pool's workers too
    )
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            partial = list(root.glob(".generate-tmp-*/images/*.jpg")) if root.exists() else []
            if len(partial) >= 50:
                break
            time.sleep(0.01)
        else:
            pytest.fail("generation never started writing")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not data.verify(root).ok
    assert not paths.manifest_path(root).exists()
    # The next run cleans up and regenerates (smaller here, to keep the test quick).
    data.ensure(root, count=40, seed=1, progress=False)
    assert data.verify(root).ok
    assert not list(root.glob(".generate-tmp-*"))


def test_jpegs_are_as_large_as_imagenets_on_average():
    """Byte-driven effects (I/O, the small-file penalty, raw/JPEG size ratios) need ImageNet-sized files.

    ImageNet's training set: about 140 GB in 1.28 million JPEGs, 109 kB a file. The
    generator must stay within 15 % of that; 300 rendered images estimate the mean to
    within a few per cent.
    """
    imagenet_mean = 140e9 / 1.28e6
    labels = data.labels_for(300, data.DEFAULT_SEED)
    sizes = [len(data.render(i, int(labels[i]))[0]) for i in range(300)]
    mean = sum(sizes) / len(sizes)
    assert 0.85 * imagenet_mean <= mean <= 1.15 * imagenet_mean, f"mean {mean / 1e3:.0f} kB, ImageNet's {imagenet_mean / 1e3:.0f} kB"


# ------------------------------------------------------------------------ small-data mode


def test_default_count_follows_packlab_count(monkeypatch, tmp_path):
    monkeypatch.setenv("PACKLAB_SETTINGS", str(tmp_path / "no-settings.mk"))  # whatever this checkout's settings.mk says
    monkeypatch.delenv(data.COUNT_ENV_VAR, raising=False)
    assert data.default_count() == data.DEFAULT_COUNT == 10_000
    monkeypatch.setenv(data.COUNT_ENV_VAR, "2000")
    assert data.default_count() == 2000
    monkeypatch.setenv(data.COUNT_ENV_VAR, "2_000")
    assert data.default_count() == 2000


@pytest.mark.parametrize("value, problem", [("lots", "not a whole number"), ("100", "too small"), ("-5", "too small")])
def test_a_bad_packlab_count_is_named_in_the_error(monkeypatch, value, problem):
    monkeypatch.setenv(data.COUNT_ENV_VAR, value)
    with pytest.raises(ValueError, match=problem) as raised:
        data.default_count()
    assert data.COUNT_ENV_VAR in str(raised.value)


def test_ensure_and_generation_follow_packlab_count(monkeypatch, tmp_path):
    monkeypatch.setenv("PACKLAB_SETTINGS", str(tmp_path / "no-settings.mk"))
    monkeypatch.setenv(data.COUNT_ENV_VAR, str(data.MIN_COUNT))
    root = data.ensure(tmp_path / "small", seed=3, progress=False)
    assert len(data.load_manifest(root)) == data.MIN_COUNT
    assert data.generation_settings(root)["count"] == data.MIN_COUNT
    assert data.verify(root, count=data.default_count()).ok
    monkeypatch.delenv(data.COUNT_ENV_VAR)
    report = data.verify(root, count=data.default_count())
    assert not report.ok and f"lists {data.MIN_COUNT} images" in report.problems[0] and "10000" in report.problems[0]


def test_cli_verify_checks_the_size_only_when_one_is_asked_for(copy_of_small):
    cmd = [sys.executable, "-m", "packlab.data", "--root", str(copy_of_small), "--verify", "-q"]
    env = {k: v for k, v in os.environ.items() if k != data.COUNT_ENV_VAR}
    env["PACKLAB_SETTINGS"] = str(copy_of_small / "no-settings.mk")
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env).returncode == 0
    wrong = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**env, data.COUNT_ENV_VAR: "2000"})
    assert wrong.returncode == 1 and "lists 60 images" in wrong.stderr and "PACKLAB_COUNT=2000" in wrong.stderr
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**env, data.COUNT_ENV_VAR: "x"})
    assert bad.returncode == 2 and "PACKLAB_COUNT" in bad.stderr
