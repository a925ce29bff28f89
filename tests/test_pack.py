"""Archives written by packlab.pack hold exactly the dataset, in the promised layout."""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
import zipfile
from collections import Counter

import numpy as np
import pytest
import torch

from packlab import data, pack
from packlab.transforms import RAW_SHAPE, pixels_to_tensor, standard_transform


@pytest.mark.parametrize("compression", ["stored", "deflated"])
def test_zip_of_jpegs_round_trips_the_original_bytes(tmp_path, small_root, small_manifest, compression):
    path = pack.write_zip(tmp_path / "a.zip", compression=compression, root=small_root, progress=False)
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        assert names[0] == pack.ZIP_LABELS_MEMBER
        assert names[1:] == [f"{s.key}.jpg" for s in small_manifest]
        for sample in small_manifest:
            info = zf.getinfo(f"{sample.key}.jpg")
            assert info.compress_type == pack.COMPRESSIONS[compression]
            assert hashlib.sha256(zf.read(info)).hexdigest() == sample.sha256
        labels = zf.read(pack.ZIP_LABELS_MEMBER).decode().splitlines()
    assert labels[0] == "key,label"
    assert labels[1:] == [f"{s.key},{s.label}" for s in small_manifest]
    assert not list(tmp_path.glob("*.partial*"))


def test_zip_of_raw_pixels_equals_the_standard_transform(tmp_path, small_root, small_manifest):
    path = pack.write_zip(tmp_path / "raw.zip", members="raw", compression="deflated", root=small_root, progress=False)
    with zipfile.ZipFile(path) as zf:
        for sample in small_manifest[:8]:
            raw = zf.read(f"{sample.key}.raw")
            assert len(raw) == int(np.prod(RAW_SHAPE))
            expected = standard_transform(data.image_path(sample.key, small_root).read_bytes())
            assert torch.equal(pixels_to_tensor(raw), expected)


def test_raw_zip_is_larger_than_the_jpeg_zip_and_deflate_shrinks_it(tmp_path, small_root, small_manifest):
    # 256x256x3 bytes per raw member against ImageNet-sized JPEGs (about 110 kB): 1.5-2x, not more.
    jpeg = pack.write_zip(tmp_path / "j.zip", root=small_root, progress=False).stat().st_size
    raw_stored = pack.write_zip(tmp_path / "rs.zip", members="raw", root=small_root, progress=False).stat().st_size
    raw_deflated = pack.write_zip(
        tmp_path / "rd.zip", members="raw", compression="deflated", root=small_root, progress=False
    ).stat().st_size
    assert raw_stored > 1.5 * jpeg
    assert raw_deflated < raw_stored


def test_zip_archives_are_reproducible(tmp_path, small_root, monkeypatch):
    a = pack.write_zip(tmp_path / "1.zip", root=small_root, progress=False).read_bytes()
    # The second written as if a minute later: no member may carry the time it was written (CI once crossed a second).
    later = time.localtime(time.time() + 60)
    monkeypatch.setattr(time, "localtime", lambda *seconds: later)
    b = pack.write_zip(tmp_path / "2.zip", root=small_root, progress=False).read_bytes()
    assert a == b


def test_bad_arguments_are_refused(tmp_path, small_root):
    with pytest.raises(ValueError, match="members"):
        pack.write_zip(tmp_path / "x.zip", members="png", root=small_root, progress=False)
    with pytest.raises(ValueError, match="compression"):
        pack.write_zip(tmp_path / "x.zip", compression="bzip2", root=small_root, progress=False)


def test_raw_folder_has_one_file_per_sample(tmp_path, small_root, small_manifest):
    folder = pack.write_raw_folder(tmp_path / "raw", root=small_root, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == [f"{s.key}.raw" for s in small_manifest]


def test_raw_folder_copied_from_a_raw_zip_holds_the_decoded_pixels(tmp_path, small_root, small_manifest):
    decoded = pack.write_raw_folder(tmp_path / "decoded", root=small_root, progress=False)
    raw_zip = pack.write_zip(tmp_path / "raw.zip", members="raw", root=small_root, progress=False)
    copied = pack.write_raw_folder(tmp_path / "copied", root=small_root, progress=False, from_zip=raw_zip)
    assert [(p.name, p.read_bytes()) for p in sorted(copied.iterdir())] == \
           [(p.name, p.read_bytes()) for p in sorted(decoded.iterdir())]


def _tar_members(path):
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def test_tar_shards_follow_the_webdataset_convention(tmp_path, small_root, small_manifest):
    shards = pack.write_tar_shards(tmp_path, root=small_root, maxcount=16, progress=False)
    assert [p.name for p in shards] == [f"shard-{i:06d}.tar" for i in range(4)]
    by_key = {s.key: s for s in small_manifest}
    order = pack.shuffled(small_manifest, 0)
    seen = Counter()
    for i, shard in enumerate(shards):
        members = _tar_members(shard)
        names = [name for name, _ in members]
        expected = [n for s in order[16 * i : 16 * (i + 1)] for n in (f"{s.key}.cls", f"{s.key}.jpg")]
        assert names == expected, "samples in the shuffled order, each sample's .cls then .jpg"
        assert len(members) <= 2 * 16
        for (cls_name, cls), (jpg_name, jpg) in zip(members[::2], members[1::2]):
            key = cls_name.removesuffix(".cls")
            assert cls_name == f"{key}.cls" and jpg_name == f"{key}.jpg", "a sample's files are adjacent"
            assert int(cls.decode()) == by_key[key].label
            assert hashlib.sha256(jpg).hexdigest() == by_key[key].sha256
            seen[key] += 1
    assert seen == Counter({s.key: 1 for s in small_manifest}), "every sample exactly once"


def test_shuffling_before_sharding_mixes_keys_across_shards(tmp_path, small_root, small_manifest):
    unshuffled = pack.write_tar_shards(tmp_path / "a", root=small_root, maxcount=20, shuffle=False, progress=False)
    first = [n for n, _ in _tar_members(unshuffled[0]) if n.endswith(".jpg")]
    assert first == [f"{s.key}.jpg" for s in small_manifest[:20]]
    shuffled = pack.write_tar_shards(tmp_path / "b", root=small_root, maxcount=20, seed=3, progress=False)
    first = [n for n, _ in _tar_members(shuffled[0]) if n.endswith(".jpg")]
    assert first != [f"{s.key}.jpg" for s in small_manifest[:20]]
    again = pack.write_tar_shards(tmp_path / "c", root=small_root, maxcount=20, seed=3, progress=False)
    assert [p.read_bytes() for p in shuffled] == [p.read_bytes() for p in again], "same seed, same shards"


def test_samples_are_written_in_the_order_given_never_re_sorted(tmp_path, small_root, small_manifest):
    """Keys that encode the class (ImageNet's n01440764_*) would regroup by class if a shard were sorted
    by name; the writer keeps the order it is given, each sample's files adjacent."""
    mixed = small_manifest[::-1]  # any order that sorting by key would change
    shards = pack.write_tar_shards(tmp_path, samples=mixed, root=small_root, maxcount=25, shuffle=False, progress=False)
    names = [name for shard in shards for name, _ in _tar_members(shard)]
    assert names == [n for s in mixed for n in (f"{s.key}.cls", f"{s.key}.jpg")]
    assert names != sorted(names)


def test_shards_from_a_class_sorted_list_stay_class_sorted(tmp_path, small_root, small_manifest):
    by_class = sorted(small_manifest, key=lambda s: (s.label, s.key))
    shards = pack.write_tar_shards(tmp_path, samples=by_class, root=small_root, maxcount=6, shuffle=False, progress=False)
    for shard in shards:
        labels = {int(payload) for name, payload in _tar_members(shard) if name.endswith(".cls")}
        assert len(labels) == 1


@pytest.mark.parametrize("samples_worth", [1, 3])
def test_maxsize_bounds_every_shard_on_disk(tmp_path, small_root, small_manifest, samples_worth):
    # The limit in units of the largest sample's shard, so it fits whatever size the generated JPEGs have.
    largest = max(pack.tar_archive_size(pack.tar_member_size(1) + pack.tar_member_size(s.bytes)) for s in small_manifest)
    maxsize = samples_worth * largest
    shards = pack.write_tar_shards(tmp_path, root=small_root, maxcount=10_000, maxsize=maxsize, progress=False)
    sizes = [p.stat().st_size for p in shards]
    assert max(sizes) <= maxsize
    assert len(shards) > 1


def test_a_sample_larger_than_maxsize_is_an_error(tmp_path, small_root):
    with pytest.raises(ValueError, match="more than maxsize"):
        pack.write_tar_shards(tmp_path, root=small_root, maxsize=20_000, progress=False)


def test_old_shards_are_replaced(tmp_path, small_root):
    pack.write_tar_shards(tmp_path, root=small_root, maxcount=5, progress=False)
    shards = pack.write_tar_shards(tmp_path, root=small_root, maxcount=30, progress=False)
    assert sorted(tmp_path.glob("shard-*.tar")) == shards and len(shards) == 2


def test_brace_pattern_round_trips(tmp_path):
    names = [tmp_path / f"shard-{i:06d}.tar" for i in range(3, 13)]
    pattern = pack.brace_pattern(names)
    assert pattern == f"{tmp_path}/shard-{{000003..000012}}.tar"
    assert pack.expand_pattern(pattern) == [str(n) for n in names]
    assert pack.brace_pattern(names[:1]) == str(names[0])
    with pytest.raises(ValueError, match="consecutively"):
        pack.brace_pattern([names[0], names[2]])


def test_tar_member_accounting_matches_tarfile():
    for nbytes in (0, 1, 511, 512, 513, 40_000):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            info = tarfile.TarInfo("000000.jpg")
            info.size = nbytes
            tar.addfile(info, io.BytesIO(b"x" * nbytes))
        assert len(buf.getvalue()) == pack.tar_archive_size(pack.tar_member_size(nbytes))


def test_cached_artefacts_are_rebuilt_when_the_dataset_is_newer(tmp_path, small_root):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(small_root, root)
    first = pack.ensure_zip(root=root, progress=False)
    mtime = first.stat().st_mtime_ns
    assert pack.ensure_zip(root=root, progress=False).stat().st_mtime_ns == mtime
    shards = pack.ensure_tar_shards(maxcount=25, root=root, progress=False)
    assert len(shards) == 3
    written = shards[0].stat().st_mtime_ns
    assert pack.ensure_tar_shards(maxcount=25, root=root, progress=False)[0].stat().st_mtime_ns == written
    # Shards in an older layout (sorted by name) are written again, in today's.
    old_layout = sorted(pack.shuffled(data.load_manifest(root), 0)[:25], key=lambda s: s.key)
    pack.write_tar_shards(shards[0].parent, samples=old_layout, root=root, maxcount=25, shuffle=False, progress=False)
    for i in range(1, 3):  # the same count of shards, so only their contents can tell
        shutil.copy(shards[0], shards[0].with_name(f"shard-{i:06d}.tar"))
    rewritten = pack.ensure_tar_shards(maxcount=25, root=root, progress=False)
    assert [n for n, _ in _tar_members(rewritten[0])] == [
        n for s in pack.shuffled(data.load_manifest(root), 0)[:25] for n in (f"{s.key}.cls", f"{s.key}.jpg")
    ]
    import os

    os.utime(data.paths.manifest_path(root))  # as if regenerated
    assert pack.ensure_zip(root=root, progress=False).stat().st_mtime_ns != mtime


def test_the_course_shards_are_ten_whatever_the_size(tmp_path, small_root):
    """Chapter 6 splits them over two ranks of two workers: a fixed 1,000 a shard gave 2,000 images two shards."""
    assert [pack.course_shard_size(n) for n in (10_000, 2_000, 500, 60)] == [1000, 200, 50, 6]
    assert all(-(-n // pack.course_shard_size(n)) == pack.COURSE_SHARDS for n in (10_000, 2_345, 2_000, 999, 500))
    import shutil

    root = shutil.copytree(small_root, tmp_path / "root")
    shards = pack.ensure_tar_shards(root=root, progress=False)
    assert len(shards) == pack.COURSE_SHARDS
    assert sum(len(_tar_members(s)) for s in shards) == 2 * len(data.load_manifest(root))
