"""A network round trip where there is none: a TCP proxy on 127.0.0.1 that delays every chunk.

The course's object store (:mod:`packlab.objectstore`) runs on this machine and answers in
well under a millisecond. A real object store answers in 20-100 ms to the first byte: the
request crosses a network, the service looks the key up and starts sending. What that
costs a data loader depends on *how many times it waits*, which this module makes
visible on one machine.

How the delay is added
----------------------
The usual tool is the kernel's ``netem`` queueing discipline (``tc qdisc add dev lo root
netem delay 40ms``), which delays every packet on an interface. Many kernels (this course
machine's among them) are built without it: ``tc`` then answers *Specified qdisc kind is
unknown*. :func:`netem_available` checks, inside a throw-away network namespace
(``unshare -rn``, no root and no effect on the machine's own interfaces).

So :class:`DelayProxy` adds the delay in user space instead. It listens on
``127.0.0.1:<port>`` and forwards each connection to ``upstream`` (the S3 gateway); a
client is pointed at the proxy's :attr:`~DelayProxy.endpoint` instead of the server's.
Each chunk of bytes is forwarded ``rtt_ms / 2`` after it *arrived*, in each direction, in
order (as netem's ``delay``: the delay is not cumulative per chunk, so a long body still
streams at full speed, only shifted by the delay). With ``mbps`` each direction of each
connection is also paced to that rate. With ``handshake`` (the default) a new connection
cannot deliver its first byte before one round trip has passed, as TCP's SYN / SYN-ACK
takes one (TLS, which real S3 endpoints use, would add one or two more: not modelled).

So over the proxy, with ``rtt`` the round trip:

* a request on a connection that is already open waits ``rtt`` for its first byte;
* the first request on a new connection waits ``2 x rtt``;
* a 100 MB body takes ``rtt`` longer than without the proxy, not 100 MB / chunk x ``rtt``.

What it does not model: TCP's window (the proxy buffers without limit, so the
bandwidth-delay product never throttles a stream), loss, jitter, and the server's own
time per request, which on a real store is part of the 20-100 ms.

What it counts
--------------
Per proxy (:meth:`DelayProxy.stats`): ``connections`` accepted, ``requests`` (HTTP request
heads in the client-to-server stream: HTTP/1.1 keeps a connection open for the next
request, so requests and connections differ), ``methods`` (a count per HTTP method), and
``bytes_up`` / ``bytes_down`` (client to server, server to client). The request count
reads the stream as HTTP/1.1: a head ends with an empty line, a body follows with
``Content-Length`` bytes or in ``chunked`` transfer encoding, then the next head begins.
It is meant for plain HTTP on loopback; TLS would hide the heads.

The proxy runs an ``asyncio`` loop in one background thread; use it as a context manager
(``with DelayProxy(("127.0.0.1", port), rtt_ms=40) as proxy:``), which stops the loop,
closes every connection and the listening socket, and joins the thread.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field

#: Methods whose name starts an HTTP request line (RFC 9110, plus PATCH).
HTTP_METHODS = (b"GET", b"HEAD", b"PUT", b"POST", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE")

_CHUNK = 64 * 1024


# ------------------------------------------------------------------ is the kernel's netem there?


def netem_available(timeout: float = 10.0) -> bool:
    """Whether this kernel can add delay with ``tc qdisc ... netem`` (tried in a private network namespace).

    Runs ``unshare -rn tc qdisc add dev lo root netem delay 1ms``: ``-r`` maps the user to
    root inside a new user namespace and ``-n`` gives it a network namespace of its own, so
    the try needs no privileges and touches none of the machine's interfaces; both vanish
    when the command ends. ``False`` when ``unshare`` or ``tc`` is missing, user namespaces
    are not allowed, or the qdisc is unknown.
    """
    unshare, tc = shutil.which("unshare"), shutil.which("tc") or "/usr/sbin/tc"
    if unshare is None or not shutil.which(tc):
        return False
    try:
        done = subprocess.run([unshare, "-rn", tc, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                              check=False, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def latency_mechanism() -> str:
    """A sentence for the chapter: which mechanism could add the latency on this machine."""
    if netem_available():
        return ("this kernel has netem (tc qdisc ... netem delay), but the course adds the delay with "
                "packlab.netdelay.DelayProxy, a user-space TCP proxy, so it works the same on every machine")
    return ("this kernel has no netem (tc: 'Specified qdisc kind is unknown'), so the delay is added by "
            "packlab.netdelay.DelayProxy, a user-space TCP proxy on 127.0.0.1")


# ------------------------------------------------------------------ counting HTTP requests in a byte stream


class RequestCounter:
    """Reads a client-to-server HTTP/1.1 byte stream as it goes by and counts the request heads.

    :meth:`feed` takes the bytes in whatever chunks they arrive. Between requests it
    collects a head up to its empty line; a head whose first word is an HTTP method counts.
    Then it skips the body: ``Content-Length`` bytes, or ``chunked`` chunks up to the
    zero-size one and its trailer.
    """

    def __init__(self):
        self.requests = 0
        self.methods: collections.Counter = collections.Counter()
        self._buffer = b""
        self._state = "head"  # head | body | chunk-size | chunk-data | trailer
        self._left = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while self._buffer:
            if self._state == "head":
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head, self._buffer = self._buffer[:end], self._buffer[end + 4:]
                self._start_request(head)
            elif self._state == "body":
                taken = min(self._left, len(self._buffer))
                self._buffer, self._left = self._buffer[taken:], self._left - taken
                if self._left == 0:
                    self._state = "head"
            elif self._state == "chunk-size":
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    return
                line, self._buffer = self._buffer[:end], self._buffer[end + 2:]
                size = int(line.split(b";")[0].strip() or b"0", 16)
                self._state, self._left = ("chunk-data", size + 2) if size else ("trailer", 0)
            elif self._state == "chunk-data":
                taken = min(self._left, len(self._buffer))
                self._buffer, self._left = self._buffer[taken:], self._left - taken
                if self._left == 0:
                    self._state = "chunk-size"
            elif self._state == "trailer":
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    return
                line, self._buffer = self._buffer[:end], self._buffer[end + 2:]
                if not line:
                    self._state = "head"

    def _start_request(self, head: bytes) -> None:
        lines = head.lstrip(b"\r\n").split(b"\r\n")
        method = lines[0].split(b" ", 1)[0]
        if method in HTTP_METHODS:
            self.requests += 1
            self.methods[method.decode()] += 1
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            self._state = "chunk-size"
        elif int(headers.get(b"content-length", b"0") or 0) > 0:
            self._state, self._left = "body", int(headers[b"content-length"])
        else:
            self._state = "head"


# ------------------------------------------------------------------ the proxy


@dataclass
class ProxyStats:
    """What went through a :class:`DelayProxy` (since it started or was :meth:`~DelayProxy.reset`)."""

    connections: int = 0
    requests: int = 0
    bytes_up: int = 0    # client -> server
    bytes_down: int = 0  # server -> client
    methods: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"connections": self.connections, "requests": self.requests, "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down, "methods": dict(self.methods)}


class DelayProxy:
    """A TCP proxy on ``127.0.0.1`` in front of ``upstream`` that adds ``rtt_ms`` of round trip (see the module).

    ``rtt_ms`` and ``mbps`` may be changed while it runs; they apply to chunks that arrive
    afterwards. :attr:`endpoint` is ``http://127.0.0.1:<port>`` for HTTP clients.
    """

    def __init__(self, upstream: tuple[str, int], rtt_ms: float = 0.0, mbps: float | None = None,
                 handshake: bool = True, host: str = "127.0.0.1"):
        self.upstream = upstream
        self.rtt_ms = float(rtt_ms)
        self.mbps = mbps
        self.handshake = handshake
        self.host = host
        self.port: int | None = None
        self._stats = ProxyStats()
        self._counters: list[RequestCounter] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._lock = threading.Lock()

    # -- life cycle
    def start(self) -> DelayProxy:
        if self._thread is not None:
            raise RuntimeError("the proxy is already running")
        started = threading.Event()
        failure: list[BaseException] = []

        def run():
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(self._handle, self.host, 0))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"DelayProxy->{self.upstream[0]}:{self.upstream[1]}",
                                        daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    async def _shutdown(self) -> None:
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def stop(self) -> None:
        """Close every connection and the listening socket, and end the thread."""
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("the proxy has not been started")
        return f"http://{self.host}:{self.port}"

    # -- counts
    def stats(self) -> dict:
        """``connections``, ``requests``, ``bytes_up``, ``bytes_down`` and ``methods`` so far (a copy)."""
        with self._lock:
            methods = collections.Counter()
            for counter in self._counters:
                methods.update(counter.methods)
            self._stats.requests = sum(c.requests for c in self._counters)
            self._stats.methods = dict(methods)
            return self._stats.as_dict()

    def reset(self) -> None:
        """Start counting from zero (connections already open keep running, and count from now)."""
        with self._lock:
            self._stats = ProxyStats()
            for counter in self._counters:
                counter.requests, counter.methods = 0, collections.Counter()

    # -- one connection
    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        accepted = time.monotonic()
        counter = RequestCounter()
        with self._lock:
            self._stats.connections += 1
            self._counters.append(counter)
        self._writers.add(client_writer)
        server_writer = None
        pipes: list[asyncio.Task] = []
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
            self._writers.add(server_writer)
            not_before = accepted + self.rtt_ms / 1000.0 if self.handshake else 0.0
            pipes = [asyncio.ensure_future(self._pipe(client_reader, server_writer, "bytes_up", counter, not_before)),
                     asyncio.ensure_future(self._pipe(server_reader, client_writer, "bytes_down", None, 0.0))]
            await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
        except (OSError, asyncio.CancelledError):  # a broken connection, or stop(): end this one quietly
            pass
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for writer in (client_writer, server_writer):
                if writer is not None:
                    writer.close()
                    self._writers.discard(writer)
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
                    counter: RequestCounter | None, not_before: float) -> None:
        """Forward ``reader`` to ``writer``: each chunk ``rtt / 2`` after it arrived, in order, paced to ``mbps``."""
        queue: asyncio.Queue = asyncio.Queue()

        async def receive():
            try:
                while True:
                    chunk = await reader.read(_CHUNK)
                    queue.put_nowait((time.monotonic(), chunk))
                    if not chunk:
                        return
            except OSError:
                queue.put_nowait((time.monotonic(), b""))

        receiving = asyncio.ensure_future(receive())
        free_at = 0.0  # when the paced link is free for the next chunk
        try:
            while True:
                arrived, chunk = await queue.get()
                depart = max(max(arrived, not_before) + self.rtt_ms / 2000.0, free_at)
                if self.mbps:  # the chunk leaves when its last bit is on the wire
                    depart = free_at = depart + len(chunk) * 8 / (self.mbps * 1e6)
                wait = depart - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                if counter is not None:
                    with self._lock:
                        counter.feed(chunk)
                with self._lock:
                    setattr(self._stats, direction, getattr(self._stats, direction) + len(chunk))
                writer.write(chunk)
                await writer.drain()
        finally:
            receiving.cancel()
            await asyncio.gather(receiving, return_exceptions=True)

    def __repr__(self) -> str:
        where = self.endpoint if self.port else "not started"
        return f"DelayProxy({where} -> {self.upstream[0]}:{self.upstream[1]}, rtt {self.rtt_ms:g} ms)"


def upstream_of(endpoint: str) -> tuple[str, int]:
    """``http://127.0.0.1:8333`` -> ``("127.0.0.1", 8333)``."""
    import urllib.parse

    parsed = urllib.parse.urlparse(endpoint)
    return parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
