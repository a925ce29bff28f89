"""Reading a tar shard front to back: open it, walk its members, group them into samples.

Stages 4 and 5 of :mod:`packlab.loaders.tar`. The format is read here rather than through
:mod:`tarfile`'s streaming mode, which takes a damaged header or a shard cut off between
two members for the end of the archive: every header's checksum is checked and the
end-of-archive marker is required, so a damaged shard raises :class:`ShardError` naming
the shard and the member.
"""

from __future__ import annotations

import collections
import gzip
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

#: Extensions every sample must have: the encoded image and its class label.
IMAGE_EXTENSION = "jpg"
LABEL_EXTENSION = "cls"
REQUIRED_EXTENSIONS = (IMAGE_EXTENSION, LABEL_EXTENSION)

_BLOCK = 512
#: A tar archive ends with two blocks of zeros.
_END_OF_ARCHIVE = bytes(2 * _BLOCK)


class ShardError(RuntimeError):
    """A shard cannot be opened, is truncated or corrupt, or holds an incomplete sample.

    The message always names the shard (and the member, when there is one).
    """


def open_shard(name: str, timeout: float = 60.0) -> BinaryIO:
    """Open a shard for sequential reading: a local path, ``file://`` or ``http(s)://`` URL.

    HTTP goes through :func:`urllib.request.urlopen`; ``timeout`` (seconds) bounds every
    wait for the server, so a stalled server raises instead of hanging a worker.
    Object stores (S3, GCS) work the same way through their HTTP endpoints or a client
    library that returns a readable stream: pass such a function as ``opener=``.
    """
    scheme = urllib.parse.urlparse(name).scheme
    if scheme in ("http", "https"):
        try:
            return urllib.request.urlopen(name, timeout=timeout)
        except (urllib.error.URLError, OSError) as exc:
            raise ShardError(f"cannot open shard {name}: {exc}. Is the server up and the name right?") from None
    path = urllib.request.url2pathname(urllib.parse.urlparse(name).path) if scheme == "file" else name
    try:
        return open(path, "rb")
    except OSError as exc:
        raise ShardError(f"cannot open shard {name}: {exc.strerror}. Check the shard list or pattern.") from None


class ShardOpener:
    """The default ``opener=``: :func:`open_shard` for a whole shard, and ``open_from`` for a part of one.

    ``open_from(name, offset, etag=None, end=None)`` opens a shard at byte ``offset``,
    reading up to byte ``end`` (exclusive; None: to the end of the shard): a ``seek`` on a
    local file, an HTTP ``Range: bytes=offset-(end - 1)`` request for a URL (chapter 10;
    :meth:`packlab.objectstore.S3ShardOpener.open_from` does the same for ``s3://``). A tar
    stream can start again at any member's header, so a reader that knows where a sample's
    headers begin can read that sample alone (:func:`read_sample_spans`): resuming a
    shuffle buffer (:mod:`packlab.resume`) then costs the buffered samples' bytes, not
    their shards' from byte 0. ``etag`` is accepted for the openers' common signature; a
    local file or a plain web server has none to check.
    """

    def __call__(self, name: str) -> BinaryIO:
        return open_shard(name)

    def open_from(self, name: str, offset: int, etag: str | None = None, end: int | None = None) -> BinaryIO:
        scheme = urllib.parse.urlparse(name).scheme
        if scheme in ("http", "https"):
            wanted = f"bytes={offset}-{'' if end is None else end - 1}"
            request = urllib.request.Request(name, headers={"Range": wanted})
            try:
                response = urllib.request.urlopen(request, timeout=60.0)
            except (urllib.error.URLError, OSError) as exc:
                raise ShardError(f"cannot open shard {name} at byte {offset:,}: {exc}. Is the server up?") from None
            if offset and response.status != 206:
                response.close()
                raise ShardError(f"the server of {name} ignored the range request ({wanted}, answered "
                                 f"{response.status}): it cannot resume a shard in the middle")
            return response
        stream = open_shard(name)
        stream.seek(offset)
        return stream


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    """``size`` bytes from ``stream``, or fewer only if the stream ends first.

    Files return everything asked for in one read; pipes and sockets may return less,
    so keep reading.
    """
    chunk = stream.read(size)
    if len(chunk) == size or not chunk:
        return chunk
    parts = [chunk]
    got = len(chunk)
    while got < size:
        more = stream.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _header_number(field: bytes) -> int:
    """A numeric header field: octal digits, NUL/space padded, or GNU base-256 for large values."""
    if field[0] & 0x80:  # base-256: the remaining bits are a big-endian binary number
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    return int(digits, 8) if digits else 0


def _header_string(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes) -> dict[str, str]:
    """The ``key=value`` records of a pax extended header ("%d %s=%s\\n", length first)."""
    records, position = {}, 0
    while position < len(payload):
        space = payload.index(b" ", position)
        length = int(payload[position:space])
        key, _, value = payload[space + 1 : position + length - 1].partition(b"=")
        records[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


#: Type flags of members whose bytes are a file's contents.
_REGULAR_FILE_TYPES = (b"0", b"\0", b"7")


def iter_tar_members(stream: BinaryIO, source: str) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member name, bytes)`` for the regular files of a tar stream, in order.

    A tar archive is a sequence of members, each a 512-byte header (name, size in octal,
    type, a checksum of the header) followed by the contents padded to a multiple of 512
    bytes, and it ends with two blocks of zeros. This reads it front to back, never
    seeking, so a local file, a pipe and an HTTP response all work; ``.gz`` shards are
    decompressed on the fly. It understands the ustar, GNU and pax variants of the
    format that :mod:`tarfile` and GNU tar write (long names included) and skips
    directories, links and other non-files. ``source`` names the shard in errors.

    Unlike :mod:`tarfile` in streaming mode, which takes a cut-off file or a damaged
    header for the end of the archive and stops silently, this raises
    :class:`ShardError` for both: every header's checksum is verified, and the archive
    must end with its end-of-archive blocks.
    """
    raw = gzip.GzipFile(fileobj=stream) if source.endswith((".gz", ".tgz")) else stream
    offset = 0  # of the next header, for error messages
    long_name: str | None = None  # from a GNU 'L' member, for the member after it
    pax: dict[str, str] = {}  # from a pax 'x' member, for the member after it
    try:
        while True:
            header = _read_exactly(raw, _BLOCK)
            if len(header) < _BLOCK:
                raise ShardError(
                    f"shard {source} is truncated: it stops at byte {offset + len(header)} without tar's "
                    "end-of-archive marker, so the samples after that point are missing. Rewrite or re-download it."
                )
            if header == _END_OF_ARCHIVE[:_BLOCK]:
                second = _read_exactly(raw, _BLOCK)
                if second != _END_OF_ARCHIVE[:_BLOCK]:
                    raise ShardError(
                        f"shard {source} has a block of zeros at byte {offset} that is not followed by a second one: "
                        "the archive is damaged there. Rewrite or re-download it."
                    )
                return
            # The checksum is the sum of the header's bytes with its own field read as spaces.
            try:
                stored = _header_number(header[148:156])
            except ValueError:
                stored = -1
            computed = sum(header[:148]) + 8 * 32 + sum(header[156:])
            if stored != computed:
                raise ShardError(
                    f"shard {source} has a damaged header at byte {offset} (checksum mismatch): reading stops "
                    "there and the samples after it would be lost. Rewrite or re-download it."
                )
            size = int(pax["size"]) if "size" in pax else _header_number(header[124:136])
            padded = size + (-size % _BLOCK)
            contents = _read_exactly(raw, padded)
            if len(contents) < padded:
                raise ShardError(
                    f"shard {source} is truncated: the member whose header is at byte {offset} needs {size} bytes "
                    f"and the file ends after {len(contents)}. Rewrite or re-download it."
                )
            payload = contents[:size] if padded != size else contents
            offset += _BLOCK + padded
            kind = header[156:157]
            if kind == b"L":  # GNU long name: the contents name the next member
                long_name = _header_string(payload)
                continue
            if kind == b"x":  # pax extended header: records for the next member
                pax = _pax_records(payload)
                continue
            if kind in _REGULAR_FILE_TYPES:
                if long_name is not None:
                    name = long_name
                elif "path" in pax:
                    name = pax["path"]
                else:
                    name = _header_string(header[0:100])
                    if header[257:263] == b"ustar\0" and header[345] != 0:  # POSIX ustar: prefix/name
                        name = f"{_header_string(header[345:500])}/{name}"
                yield name, payload
            # Directories, links, pax global headers ('g'), GNU long link names ('K'): not samples.
            long_name, pax = None, {}
    except TimeoutError as exc:
        raise ShardError(f"reading shard {source} timed out ({exc}): is the server or filesystem stalled?") from None
    except (EOFError, OSError, gzip.BadGzipFile, ValueError) as exc:
        raise ShardError(f"shard {source} is truncated or corrupt: {exc}. Rewrite or re-download it.") from None


def split_key(member_name: str) -> tuple[str, str]:
    """``"dir/000123.cls"`` -> ``("dir/000123", "cls")``: the key is everything before the
    first dot of the file name, the extension everything after it (WebDataset's rule)."""
    folder, _, filename = member_name.rpartition("/")
    stem, dot, extension = filename.partition(".")
    if not dot:
        return member_name, ""
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


class RawSample(NamedTuple):
    """One sample as read from a shard, before decoding."""

    key: str
    label: int
    image_bytes: bytes
    source: str  # "<shard>:<member>", for error messages


def group_samples(members: Iterable[tuple[str, bytes]], source: str) -> Iterator[RawSample]:
    """Group consecutive members with the same key into samples.

    A sample needs one ``.jpg`` and one ``.cls`` member; other extensions are ignored.
    Missing or repeated files raise :class:`ShardError` naming the shard and the key:
    the files of a sample must sit next to each other in the archive, which is all a
    streaming reader needs (:func:`packlab.pack.write_tar_shards` and
    ``webdataset.ShardWriter`` write them so; the archive need not be sorted).
    """

    def finish(key: str, files: dict[str, bytes]) -> RawSample:
        missing = [f".{ext}" for ext in REQUIRED_EXTENSIONS if ext not in files]
        if missing:
            raise ShardError(
                f"sample {key} in shard {source} has no {' or '.join(missing)} file next to its "
                f"{', '.join('.' + e for e in files) or 'other files'}: each sample needs "
                f"{' and '.join('.' + e for e in REQUIRED_EXTENSIONS)}, next to each other in the shard "
                "(as packlab.pack.write_tar_shards and webdataset.ShardWriter write them)."
            )
        text = files[LABEL_EXTENSION].decode("ascii", errors="replace").strip()
        try:
            label = int(text)
        except ValueError:
            raise ShardError(
                f"{source}:{key}.{LABEL_EXTENSION} holds {text!r}, not an integer class label. Rewrite the shard "
                "(packlab.pack.write_tar_shards), or pass on_bad_sample='skip' to the dataset to skip such samples."
            ) from None
        return RawSample(key, label, files[IMAGE_EXTENSION], f"{source}:{key}.{IMAGE_EXTENSION}")

    key, files = None, {}
    for name, payload in members:
        member_key, extension = split_key(name)
        if member_key != key:
            if key is not None:
                yield finish(key, files)
            key, files = member_key, {}
        if extension not in REQUIRED_EXTENSIONS:
            continue
        if extension in files:
            raise ShardError(f"shard {source} holds {name} twice: sample keys must be unique")
        files[extension] = payload
    if key is not None:
        yield finish(key, files)


def iter_shard_samples(
    shard: str, opener: Callable[[str], BinaryIO] = open_shard
) -> Iterator[RawSample]:
    """All samples of one shard, in archive order, undecoded."""
    stream = opener(shard)
    try:
        count = 0
        for sample in group_samples(iter_tar_members(stream, shard), shard):
            count += 1
            yield sample
        if count == 0:
            raise ShardError(f"shard {shard} holds no samples (no .jpg + .cls pairs)")
    finally:
        stream.close()


class _CountingReader:
    """Reads through to ``stream``, counting the bytes; stops after ``limit`` bytes and then adds tar's end marker.

    With a ``limit`` the reader stands for the tar archive that holds exactly those bytes:
    the members of a sample (or a run of samples) read from the middle of a shard, followed
    by the two blocks of zeros :func:`iter_tar_members` insists on.
    """

    def __init__(self, stream: BinaryIO, limit: int | None = None):
        self.stream, self.limit, self.count = stream, limit, 0
        self._end_marker = b"" if limit is None else _END_OF_ARCHIVE

    def read(self, size: int = -1) -> bytes:
        if self.limit is not None and self.count >= self.limit:
            chunk, self._end_marker = self._end_marker[:size], self._end_marker[size:]
            return chunk
        if self.limit is not None:
            size = self.limit - self.count if size is None or size < 0 else min(size, self.limit - self.count)
        chunk = self.stream.read(size)
        self.count += len(chunk)
        return chunk

    def close(self) -> None:
        self.stream.close()


def iter_sample_spans(stream: BinaryIO, source: str, start: int = 0, limit: int | None = None,
                      ) -> Iterator[tuple[RawSample, int, int]]:
    """``(sample, begin, end)`` for the samples of a tar stream whose first byte is byte ``start`` of the shard.

    ``begin`` is the byte where the sample's first header begins (long-name and pax headers
    included), ``end`` where the next sample's begins (or where the last sample's last
    member ends): the sample is exactly the shard's bytes ``[begin, end)``, and a tar
    reader can start at ``begin``. :func:`group_samples` knows that a sample is complete
    only when it has read the first member of the next one, so the begin of each key's
    first member is noted as the members go by. With ``limit``, only that many bytes are
    read from ``stream`` (see :class:`_CountingReader`).
    """
    counted = _CountingReader(stream, limit)
    begins: collections.deque = collections.deque()  # (key, byte) of each sample whose first member was read
    last = {"end": start, "finished": False}

    def members():
        position = start
        for name, payload in iter_tar_members(counted, source):
            key = split_key(name)[0]
            if not begins or begins[-1][0] != key:
                begins.append((key, position))
            position = last["end"] = start + counted.count
            yield name, payload
        last["finished"] = True

    for sample in group_samples(members(), source):
        _, begin = begins.popleft()
        yield sample, begin, (last["end"] if last["finished"] else begins[0][1])


def read_sample_spans(shard: str, opener: Callable[[str], BinaryIO] = open_shard, begin: int = 0,
                      end: int | None = None) -> Iterator[tuple[RawSample, int, int]]:
    """``(sample, begin, end)`` for the samples of ``shard`` between bytes ``begin`` and ``end`` (None: its end).

    From byte 0 to the end this reads the shard as :func:`iter_shard_samples` does. Anything
    else needs an opener with ``open_from`` (:class:`ShardOpener`, S3's) and a ``begin`` and
    ``end`` that fall on sample boundaries, as :func:`iter_sample_spans` reported them: then
    only those bytes are requested and read. Not for compressed shards, whose byte offsets
    are the compressed stream's.
    """
    whole = begin == 0 and end is None
    if not whole and not hasattr(opener, "open_from"):
        raise ShardError(f"cannot read shard {shard} from byte {begin:,}: the opener {opener!r} has no open_from")
    stream = opener(shard) if whole else opener.open_from(shard, begin, end=end)
    try:
        found = False
        for item in iter_sample_spans(stream, shard, begin, None if end is None else end - begin):
            found = True
            yield item
        if not found and whole:
            raise ShardError(f"shard {shard} holds no samples (no .jpg + .cls pairs)")
    finally:
        stream.close()


def count_samples(shard: str | Path) -> int:
    """Number of samples (``.jpg`` members) in a local shard, from its headers alone.

    Random-access mode lets tarfile seek past the data, so this is fast even for large
    shards; chapter 6 uses it to count how many samples each rank would get.
    """
    with tarfile.open(shard, mode="r:") as tar:
        return sum(1 for info in tar if info.isfile() and split_key(info.name)[1] == IMAGE_EXTENSION)
