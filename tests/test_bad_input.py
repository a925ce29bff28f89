"""Bad input, all in one place: every reference loader fails loudly and precisely, or skips and counts.

For each kind of damage (a corrupt JPEG, a file listed in labels.csv but missing, a zip
member with a bad CRC, a truncated tar shard, a tar sample with a bad label, a missing
labels file or manifest, a data root that does not exist):

* by default the loader raises an error whose message names the file and says what to
  do, also when the error happens in a DataLoader worker;
* with ``on_bad_sample="skip"`` every good sample still arrives exactly once with the
  right label and pixels (:mod:`packlab.audit`), each bad one is named in a
  :class:`~packlab.loaders.skipping.BadSampleWarning`, and ``dataset.skipped`` counts them,
  also when DataLoader workers under fork, spawn and forkserver did the skipping;
* damage that skipping cannot repair (a missing labels file, archive or data root) raises
  in both modes.

The damaged copies are built once per module from the 60-image ``small_root`` fixture.
"""

from __future__ import annotations

import io
import multiprocessing
import shutil
import tarfile
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.utils.data import ConcatDataset, DataLoader

from packlab import audit, data, pack, paths
from packlab.bench import run_until_error
from packlab.loaders import JpegFolderDataset, PreadZipDataset, RawFolderDataset, TarShardDataset, ZipDataset
from packlab.loaders.skipping import BadSampleWarning, SkippedSample, collate_skipping_bad
from packlab.loaders import tar as tarloader
from packlab.loaders.tar import ShardError, skip_decode
from packlab.transforms import CorruptImageError

TIMEOUT = 120  # seconds a DataLoader waits for a worker's batch before failing the test (spawn start-up on a busy 2-core machine included)
START_METHODS = ["fork", "spawn", "forkserver"]

# forkserver workers fork from a server that has imported these once (see test_start_methods.py).
multiprocessing.set_forkserver_preload(["torch", "packlab.loaders", "packlab.audit"])

# Which sample is damaged how. Each dataset of the skip tests reads its own third of the keys.
FOLDER_KEYS, RAW_KEYS, ZIP_KEYS = range(0, 20), range(20, 40), range(40, 60)
CORRUPT_JPEG, MISSING_JPEG = "000003", "000007"  # in the JPEG folder
CORRUPT_RAW, MISSING_RAW = "000023", "000027"  # in the raw-pixel folder
BAD_CRC, CORRUPT_MEMBER = "000043", "000047"  # in the zip
SHARD_SAMPLES = 10  # per tar shard: 6 shards
TRUNCATED_AFTER = 4  # the truncated shard still holds this many complete samples


# ------------------------------------------------------------------ damaged copies


def truncate(path: Path, keep: float = 0.3) -> None:
    """Cut a file to a fraction of its size, as an interrupted copy leaves it."""
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])


def flip_member_byte(archive: Path, member: str) -> None:
    """Flip one byte in the middle of a stored zip member's data: its CRC-32 no longer matches."""
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo(member)
    offset = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2
    raw = bytearray(archive.read_bytes())
    raw[offset] ^= 0xFF
    archive.write_bytes(bytes(raw))


def rewrite_shard(shard: Path, dst: Path, replace: dict[str, bytes]) -> Path:
    """A copy of ``shard`` with the contents of some members replaced."""
    with tarfile.open(shard) as src, tarfile.open(dst, "w", format=tarfile.USTAR_FORMAT) as out:
        for info in src.getmembers():
            payload = replace.get(info.name, src.extractfile(info).read())
            info.size = len(payload)
            out.addfile(info, io.BytesIO(payload))
    return dst


def shard_keys(shard: Path) -> list[str]:
    with tarfile.open(shard) as tar:
        return [name[:-4] for name in tar.getnames() if name.endswith(".jpg")]


@pytest.fixture(scope="module")
def damaged(small_root, small_manifest, tmp_path_factory):
    """Damaged copies of the small dataset in every format, and what was done to them."""
    base = tmp_path_factory.mktemp("damaged")
    root = base / "root"
    shutil.copytree(small_root, root)
    truncate(data.image_path(CORRUPT_JPEG, root))
    truncate(data.image_path(CORRUPT_MEMBER, root))

    zip_path = pack.write_zip(base / "damaged.zip", root=root, samples=small_manifest, progress=False)
    flip_member_byte(zip_path, f"{BAD_CRC}.jpg")
    data.image_path(MISSING_JPEG, root).unlink()  # after writing the zip, which reads every file

    raw = pack.write_raw_folder(base / "raw", samples=[s for s in small_manifest if int(s.key) in RAW_KEYS],
                                root=small_root, progress=False)
    truncate(raw / f"{CORRUPT_RAW}.raw")
    (raw / f"{MISSING_RAW}.raw").unlink()

    # Tar: six shards of ten; one cut off in its fifth sample's JPEG, one with a label that
    # is not a number, one with a corrupt JPEG. The rest are intact.
    good = pack.write_tar_shards(base / "good-shards", root=small_root, maxcount=SHARD_SAMPLES, progress=False)
    shards_dir = base / "shards"
    shards_dir.mkdir()
    shards = [Path(shutil.copy(s, shards_dir / s.name)) for s in good]
    truncated, mislabelled, corrupt = shards[1], shards[2], shards[4]
    with tarfile.open(good[1]) as tar:
        jpeg = tar.getmember(f"{shard_keys(good[1])[TRUNCATED_AFTER]}.jpg")
        cut = jpeg.offset_data + jpeg.size // 2
    truncated.write_bytes(good[1].read_bytes()[:cut])
    bad_label_key, corrupt_key = shard_keys(good[2])[3], shard_keys(good[4])[6]
    rewrite_shard(good[2], mislabelled, {f"{bad_label_key}.cls": b"seven"})
    corrupt_jpeg = data.image_path(corrupt_key, small_root).read_bytes()[:500]
    rewrite_shard(good[4], corrupt, {f"{corrupt_key}.jpg": corrupt_jpeg})

    return SimpleNamespace(
        root=root, zip=zip_path, raw=raw, shards=shards, intact=shards[0], truncated=truncated, mislabelled=mislabelled,
        corrupt_shard=corrupt, bad_label_key=bad_label_key, corrupt_key=corrupt_key,
        lost_keys=shard_keys(good[1])[TRUNCATED_AFTER:],  # unreadable after the cut
    )


@pytest.fixture(scope="module")
def reference(small_root, small_manifest):
    return audit.reference_digests([s.key for s in small_manifest], small_root)


def keys_in(indices) -> list[str]:
    return [data.key_of(i) for i in indices]


def expect_error(call, error_type, *fragments):
    """Run ``call``; it must raise ``error_type`` with every fragment in its message. Returns the message."""
    with pytest.raises(error_type) as raised:
        call()
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} is not in the message:\n{message}"
    return message


def through_workers(dataset, method="fork"):
    """One epoch through 2 DataLoader workers: the exception it ended with (None if it did not)."""
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=method, timeout=TIMEOUT)
    return run_until_error(loader)[1]


# ------------------------------------------------------- raise (the default): name the file, say what to do

def around(bad_key: str) -> list[str]:
    """Four keys with ``bad_key`` third (index 2) and no other damaged sample among them."""
    return keys_in(range(int(bad_key) - 2, int(bad_key) + 2))


# (id, dataset factory, index or None for an iterable, error type, fragments the message must hold)
PER_SAMPLE_CASES = [
    ("folder-corrupt-jpeg", lambda d: JpegFolderDataset(d.root, keys=around(CORRUPT_JPEG)), 2, CorruptImageError,
     [f"{CORRUPT_JPEG}.jpg", "Check or regenerate the file", "--verify"]),
    ("folder-missing-listed-file", lambda d: JpegFolderDataset(d.root, keys=around(MISSING_JPEG)), 2,
     FileNotFoundError, [f"{MISSING_JPEG}.jpg", "is listed in", "labels.csv", "does not exist", "--verify"]),
    ("raw-folder-corrupt", lambda d: RawFolderDataset(d.raw, root=d.root, keys=around(CORRUPT_RAW)), 2,
     CorruptImageError, [f"{CORRUPT_RAW}.raw", "bytes, expected"]),
    ("raw-folder-missing", lambda d: RawFolderDataset(d.raw, root=d.root, keys=around(MISSING_RAW)), 2,
     FileNotFoundError, [f"{MISSING_RAW}.raw", "labels.csv", "--verify"]),
    ("zip-bad-crc", lambda d: ZipDataset(d.zip, keys=around(BAD_CRC)), 2, zipfile.BadZipFile,
     [f"{BAD_CRC}.jpg", "damaged.zip", "Bad CRC-32", "python -m zipfile -t", "rewrite it"]),
    ("zip-corrupt-jpeg", lambda d: ZipDataset(d.zip, keys=around(CORRUPT_MEMBER)), 2, CorruptImageError,
     [f"damaged.zip:{CORRUPT_MEMBER}.jpg", "Check or regenerate"]),
    ("pread-zip-bad-crc", lambda d: PreadZipDataset(d.zip, keys=around(BAD_CRC)), 2, zipfile.BadZipFile,
     [f"{BAD_CRC}.jpg", "damaged.zip", "Bad CRC-32", "python -m zipfile -t", "rewrite it"]),
    ("pread-zip-corrupt-jpeg", lambda d: PreadZipDataset(d.zip, keys=around(CORRUPT_MEMBER)), 2, CorruptImageError,
     [f"damaged.zip:{CORRUPT_MEMBER}.jpg", "Check or regenerate"]),
    # Two shards, so that each of the two workers has one.
    ("tar-truncated", lambda d: TarShardDataset([d.truncated, d.intact], transform=skip_decode), None, ShardError,
     ["shard-000001.tar", "truncated", "Rewrite or re-download it"]),
    ("tar-corrupt-jpeg", lambda d: TarShardDataset([d.corrupt_shard, d.intact]), None, CorruptImageError,
     ["shard-000004.tar:", "Check or regenerate"]),
    ("tar-bad-label", lambda d: TarShardDataset([d.mislabelled, d.intact], transform=skip_decode), None, ShardError,
     ["shard-000002.tar", "'seven'", "not an integer"]),
]


@pytest.mark.parametrize("case", PER_SAMPLE_CASES, ids=[c[0] for c in PER_SAMPLE_CASES])
def test_a_bad_sample_raises_naming_the_file_and_what_to_do(damaged, case):
    _, make, index, error_type, fragments = case
    dataset = make(damaged)
    expect_error((lambda: dataset[index]) if index is not None else (lambda: list(dataset)), error_type, *fragments)
    # In a DataLoader worker: the error reaches the main process with its type and message.
    error = through_workers(dataset)
    assert isinstance(error, error_type), f"expected {error_type.__name__}, got {error!r}"
    for fragment in fragments:
        assert fragment in str(error)


def _truncated_copies(shard: Path, tmp_path: Path) -> dict[str, Path]:
    raw = shard.read_bytes()
    with tarfile.open(shard) as tar:
        eleventh = tar.getmembers()[10].offset  # the header of the 11th member
    copies = {
        "mid-member": raw[: len(raw) // 2],
        "member-boundary": raw[:eleventh],
        "damaged-header": raw[:eleventh] + b"\xff" * 512 + raw[eleventh + 512 :],
    }
    out = {}
    for name, payload in copies.items():
        path = tmp_path / f"{name}-000000.tar"
        path.write_bytes(payload)
        out[name] = path
    return out


@pytest.mark.parametrize("damage", ["mid-member", "member-boundary", "damaged-header"])
def test_every_kind_of_shard_damage_raises_naming_the_shard(small_root, tmp_path, damage):
    """tarfile in streaming mode would stop silently at two of these three; the reader must not."""
    intact = pack.write_tar_shards(tmp_path / "intact", root=small_root, maxcount=30, progress=False)
    bad = _truncated_copies(intact[0], tmp_path)[damage]
    dataset = TarShardDataset([bad, intact[1]], transform=skip_decode)
    expect_error(lambda: list(dataset), ShardError, bad.name, "Rewrite or re-download it")
    error = through_workers(dataset)
    assert isinstance(error, ShardError) and bad.name in str(error)


def test_a_tar_sample_missing_its_label_raises_naming_shard_and_key(small_root, tmp_path):
    shard = pack.write_tar_shards(tmp_path / "intact", root=small_root, maxcount=60, progress=False)[0]
    path = tmp_path / "nolabel-000000.tar"
    with tarfile.open(shard) as src, tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as dst:
        victim = src.getmembers()[4].name  # a .cls member: .cls sorts before .jpg
        for info in src.getmembers():
            if info.name != victim:
                dst.addfile(info, src.extractfile(info))
    key = victim[:-4]
    expect_error(lambda: list(TarShardDataset([path], transform=skip_decode)), ShardError,
                 f"sample {key} in shard", "nolabel-000000.tar", "has no .cls", "next to each other")


def test_zip_member_damage_other_than_crc_names_member_and_archive(tmp_path, small_root, small_manifest):
    """A damaged local header (not the data) also names the member, and says how to test the archive."""
    path = pack.write_zip(tmp_path / "header.zip", samples=small_manifest[:3], root=small_root, progress=False)
    with zipfile.ZipFile(path) as z:
        offset = z.getinfo(f"{small_manifest[1].key}.jpg").header_offset
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 4] = b"XXXX"  # the local header's signature
    path.write_bytes(bytes(raw))
    for reader in (ZipDataset, PreadZipDataset):
        expect_error(lambda: reader(path)[1], zipfile.BadZipFile,
                     f"{small_manifest[1].key}.jpg", "header.zip", "python -m zipfile -t")
    # A member whose data runs past the end of the file (a directory that promises more than is there):
    dataset = PreadZipDataset(path)
    last = dataset.members[2]
    dataset.spans[last] = dataset.spans[last][:3] + (path.stat().st_size,) + dataset.spans[last][4:]
    expect_error(lambda: dataset.read_member(last), zipfile.BadZipFile, "ends inside the member's data", "header.zip")


# -------------------------------------------------------- structural damage: raises in both modes


@pytest.fixture
def root_without(small_root, tmp_path):
    """``root_without("labels.csv")``: a copy of the small dataset with one file removed."""

    def make(name: str) -> Path:
        root = tmp_path / f"without-{name}"
        shutil.copytree(small_root, root)
        (root / name).unlink()
        return root

    return make


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_a_missing_labels_file_raises_in_both_modes(root_without, mode, damaged):
    root = root_without("labels.csv")
    for make in (lambda: JpegFolderDataset(root, on_bad_sample=mode),
                 lambda: RawFolderDataset(damaged.raw, root=root, on_bad_sample=mode)):
        expect_error(make, data.DatasetError, str(paths.labels_path(root)), "does not exist", "make data",
                     paths.DATA_ENV_VAR)


def test_a_missing_manifest_raises_naming_it_wherever_it_is_needed(root_without, tmp_path):
    """The manifest is read to pack archives (all samples) and to audit epochs."""
    root = root_without("manifest.csv")
    fragments = (str(paths.manifest_path(root)), "does not exist", "make data", paths.DATA_ENV_VAR)
    expect_error(lambda: data.load_manifest(root), data.DatasetError, *fragments)
    expect_error(lambda: pack.write_zip(tmp_path / "x.zip", root=root, progress=False), data.DatasetError, *fragments)
    expect_error(lambda: pack.write_tar_shards(tmp_path / "t", root=root, progress=False), data.DatasetError, *fragments)
    expect_error(lambda: audit.reference_digests(["000000"], root), data.DatasetError, *fragments)


def test_missing_data_files_say_what_to_do(tmp_path):
    expect_error(lambda: data.load_manifest(tmp_path), data.DatasetError, "manifest.csv does not exist", "make data")
    expect_error(lambda: data.load_labels(tmp_path), data.DatasetError, "labels.csv does not exist", "PACKLAB_DATA")


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_a_data_root_or_archive_that_does_not_exist_raises_in_both_modes(tmp_path, monkeypatch, mode):
    nowhere = tmp_path / "nowhere"
    expect_error(lambda: JpegFolderDataset(nowhere, on_bad_sample=mode), FileNotFoundError,
                 str(nowhere / "images"), "does not exist", "make data")
    monkeypatch.setenv(paths.DATA_ENV_VAR, str(nowhere))  # the root most people get wrong: the variable
    expect_error(lambda: JpegFolderDataset(on_bad_sample=mode), FileNotFoundError, str(nowhere / "images"), "make data")
    expect_error(lambda: RawFolderDataset(nowhere / "raw", on_bad_sample=mode), FileNotFoundError,
                 str(nowhere / "raw"), "does not exist", "packlab.pack")
    for reader in (ZipDataset, PreadZipDataset):
        expect_error(lambda: reader(nowhere / "images.zip", on_bad_sample=mode), FileNotFoundError,
                     "nowhere/images.zip", "does not exist", "ensure_zip")
    # Shards are opened when read (they may be URLs): a missing one raises then, also in skip mode.
    expect_error(lambda: list(TarShardDataset([nowhere / "shard-000000.tar"], on_bad_sample=mode)), ShardError,
                 "nowhere/shard-000000.tar", "Check the shard list or pattern")


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_a_broken_zip_raises_in_both_modes(tmp_path, small_root, small_manifest, mode):
    bogus = tmp_path / "bogus.zip"
    bogus.write_bytes(b"this is not a zip archive at all" * 10)
    expect_error(lambda: ZipDataset(bogus, on_bad_sample=mode), zipfile.BadZipFile, "bogus.zip", "write_zip")
    unlabelled = tmp_path / "nolabels.zip"
    with zipfile.ZipFile(unlabelled, "w") as archive:
        archive.writestr("000000.jpg", b"x")
    expect_error(lambda: ZipDataset(unlabelled, on_bad_sample=mode), data.DatasetError, "nolabels.zip", "labels.csv")
    extra = pack.write_zip(tmp_path / "extra.zip", samples=small_manifest[:2], root=small_root, progress=False)
    with zipfile.ZipFile(extra, "a") as archive:
        archive.writestr("999999.jpg", b"x")  # a member without a label is not dropped silently
    expect_error(lambda: ZipDataset(extra, on_bad_sample=mode), data.DatasetError, "999999", "Rewrite the archive")


def test_on_bad_sample_accepts_raise_or_skip_only(small_root):
    with pytest.raises(ValueError, match="on_bad_sample must be one of"):
        JpegFolderDataset(small_root, on_bad_sample="ignore")


# ------------------------------------------------------------- skip: named, counted, nothing else lost


def skip_datasets(d):
    """The three map-style datasets in skip mode, each over its third of the keys (two bad samples each)."""
    return [
        JpegFolderDataset(d.root, keys=keys_in(FOLDER_KEYS), return_key=True, on_bad_sample="skip"),
        RawFolderDataset(d.raw, root=d.root, keys=keys_in(RAW_KEYS), return_key=True, on_bad_sample="skip"),
        ZipDataset(d.zip, keys=keys_in(ZIP_KEYS), return_key=True, on_bad_sample="skip"),
    ]


def test_skip_mode_pread_zip_skips_and_counts_like_zip_dataset(damaged, small_manifest, reference):
    dataset = PreadZipDataset(damaged.zip, keys=keys_in(ZIP_KEYS), return_key=True, on_bad_sample="skip")
    loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                        collate_fn=collate_skipping_bad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        records = audit.records_from_batches(loader)
    zip_samples = [s for s in small_manifest if int(s.key) in ZIP_KEYS]
    report = audit.audit_epoch(records, good_samples(zip_samples, [BAD_CRC, CORRUPT_MEMBER]), reference)
    assert report.ok, report.summary()
    assert dataset.skip_counter.by_reason() == {"unreadable member": 1, "corrupt image": 1}


MAP_STYLE_BAD = {
    CORRUPT_JPEG: "corrupt image", MISSING_JPEG: "missing file",
    CORRUPT_RAW: "corrupt image", MISSING_RAW: "missing file",
    BAD_CRC: "unreadable member", CORRUPT_MEMBER: "corrupt image",
}


def good_samples(manifest, bad_keys):
    return [s for s in manifest if s.key not in set(bad_keys)]


def test_skip_mode_in_one_process_warns_once_per_bad_sample_and_counts(damaged, small_manifest, reference):
    datasets = skip_datasets(damaged)
    loader = DataLoader(ConcatDataset(datasets), batch_size=8, collate_fn=collate_skipping_bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = audit.records_from_batches(loader)
    report = audit.audit_epoch(records, good_samples(small_manifest, MAP_STYLE_BAD), reference)
    assert report.ok, report.summary()
    messages = [str(w.message) for w in caught if issubclass(w.category, BadSampleWarning)]
    assert len(messages) == len(MAP_STYLE_BAD), messages
    for key, reason in MAP_STYLE_BAD.items():
        (message,) = [m for m in messages if f"{key}." in m.split(" (")[0]]
        assert f"({reason})" in message
    assert [d.skipped for d in datasets] == [2, 2, 2]
    assert datasets[0].skip_counter.by_reason() == {"missing file": 1, "corrupt image": 1}
    assert datasets[2].skip_counter.by_reason() == {"unreadable member": 1, "corrupt image": 1}


@pytest.mark.filterwarnings("ignore::packlab.loaders.skipping.BadSampleWarning")
@pytest.mark.parametrize("method", START_METHODS)
def test_skip_counts_reach_the_main_process_from_workers(damaged, small_manifest, reference, method):
    """Workers skip; the counts they keep in shared memory are read in the main process after the epoch."""
    datasets = skip_datasets(damaged)
    loader = DataLoader(ConcatDataset(datasets), batch_size=8, num_workers=2, multiprocessing_context=method,
                        timeout=TIMEOUT, collate_fn=collate_skipping_bad, persistent_workers=True)
    records = audit.records_from_batches(loader)
    report = audit.audit_epoch(records, good_samples(small_manifest, MAP_STYLE_BAD), reference)
    assert report.ok, report.summary()
    assert [d.skipped for d in datasets] == [2, 2, 2]
    # Counts accumulate over epochs until reset.
    audit.records_from_batches(loader, with_pixels=False)
    assert [d.skipped for d in datasets] == [4, 4, 4]
    datasets[0].skip_counter.reset()
    assert datasets[0].skipped == 0 and datasets[1].skipped == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_mode_tar_delivers_every_good_sample_once_and_counts_each_kind_of_damage(
    damaged, small_manifest, reference, workers
):
    bad = [damaged.bad_label_key, damaged.corrupt_key, *damaged.lost_keys]
    dataset = TarShardDataset(damaged.shards, return_key=True, shuffle_buffer=8, on_bad_sample="skip")
    extra = dict(num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT) if workers else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = audit.records_from_batches(DataLoader(dataset, batch_size=8, **extra))
    report = audit.audit_epoch(records, good_samples(small_manifest, bad), reference)
    assert report.ok, report.summary()
    assert dataset.skipped == 3  # the lost samples are not counted: their number is not knowable
    assert dataset.skip_counter.by_reason() == {"corrupt image": 1, "invalid sample": 1, "damaged shard": 1}
    if not workers:  # warnings raised in worker processes do not reach this process's warning log
        messages = [str(w.message) for w in caught if issubclass(w.category, BadSampleWarning)]
        assert len(messages) == 3
        for fragment in (f"shard-000002.tar:{damaged.bad_label_key} (invalid sample)",
                         f"shard-000004.tar:{damaged.corrupt_key}.jpg (corrupt image)",
                         "shard-000001.tar (damaged shard)"):
            assert sum(fragment in m for m in messages) == 1, (fragment, messages)


@pytest.mark.filterwarnings("ignore::packlab.loaders.skipping.BadSampleWarning")
def test_skip_counts_of_tar_workers_reach_the_main_process(damaged):
    """As above, for the iterable dataset. Under forkserver only: spawn pickles the counter the same
    way (tested above) and costs seconds per worker to start."""
    dataset = TarShardDataset(damaged.shards, transform=skip_decode, on_bad_sample="skip")
    loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="forkserver", timeout=TIMEOUT)
    delivered = sum(len(labels) for _, labels in loader)
    assert delivered == 60 - 1 - len(damaged.lost_keys)  # decoding is skipped: only the label is bad
    assert dataset.skip_counter.by_reason() == {"invalid sample": 1, "damaged shard": 1}


@pytest.mark.filterwarnings("ignore::packlab.loaders.skipping.BadSampleWarning")
def test_resampling_in_skip_mode_keeps_the_epoch_length_and_stops_when_nothing_is_readable(damaged, tmp_path):
    # 25 draws from one shard of 10 (the 7th corrupt): each skipped image is replaced by another draw.
    dataset = TarShardDataset([damaged.corrupt_shard], epoch_length=25, on_bad_sample="skip", return_key=True)
    keys = [key for _, _, key in dataset]
    assert len(keys) == 25 and damaged.corrupt_key not in keys
    assert dataset.skip_counter.by_reason()["corrupt image"] >= 2
    # Shards that never yield a sample end the epoch with an error instead of being drawn forever.
    empty = tmp_path / "empty-000000.tar"
    with tarfile.open(empty, "w"):
        pass
    dataset = TarShardDataset([empty], epoch_length=5, on_bad_sample="skip")
    expect_error(lambda: list(dataset), ShardError, "none of the 1 shards holds a readable sample")


def test_an_all_bad_batch_is_none(damaged):
    keys = [CORRUPT_JPEG, MISSING_JPEG, "000001"]
    dataset = JpegFolderDataset(damaged.root, keys=keys, return_key=True, on_bad_sample="skip")
    with pytest.warns(BadSampleWarning):
        batches = list(DataLoader(dataset, batch_size=2, collate_fn=collate_skipping_bad))
    assert batches[0] is None and list(batches[1][2]) == ["000001"]
    assert collate_skipping_bad([SkippedSample("a", "corrupt image")]) is None


@pytest.mark.filterwarnings("ignore::packlab.loaders.skipping.BadSampleWarning")
def test_forgetting_the_skipping_collate_fails_with_advice(damaged):
    dataset = JpegFolderDataset(damaged.root, keys=keys_in(FOLDER_KEYS), on_bad_sample="skip")
    advice = "collate_fn=packlab.loaders.skipping.collate_skipping_bad"
    marker = dataset[int(CORRUPT_JPEG)]
    assert isinstance(marker, SkippedSample) and marker.reason == "corrupt image"
    with pytest.raises(TypeError, match=advice):
        image, label = marker
    for keys in ([CORRUPT_JPEG, "000001"], ["000001", CORRUPT_JPEG]):  # the marker first, or later in the batch
        subset = JpegFolderDataset(damaged.root, keys=keys, on_bad_sample="skip")
        with pytest.raises(TypeError, match=advice):
            list(DataLoader(subset, batch_size=2))
    error = through_workers(dataset)
    assert isinstance(error, TypeError) and advice in str(error) and f"{CORRUPT_JPEG}.jpg" in str(error)


def test_a_header_with_a_bad_checksum_is_named_not_skipped(tmp_path, small_root):
    shard = pack.write_tar_shards(tmp_path / "shards", samples=data.load_manifest(small_root)[:10], root=small_root, maxcount=10, shuffle=False, progress=False)[0]
    damaged = bytearray(shard.read_bytes())
    # Find the third member's header: after member 1 and member 2 (header + padded contents each).
    position = 0
    for _ in range(2):
        size = int(damaged[position + 124 : position + 136].rstrip(b"\0 ") or b"0", 8)
        position += 512 + size + (-size % 512)
    third_header = position
    damaged[third_header + 10] ^= 0xFF  # one flipped byte in the name field
    broken = tmp_path / "broken.tar"
    broken.write_bytes(bytes(damaged))
    with pytest.raises(tarloader.ShardError, match=rf"broken\.tar has a damaged header at byte {third_header}"):
        list(tarloader.iter_shard_samples(str(broken)))
