"""Serve a folder over HTTP from this machine, to read shards "remotely" without a network.

Training jobs often read shards from a web server or an object store (S3, GCS and the
like speak HTTP). Because :class:`packlab.loaders.tar.TarShardDataset` reads each shard
front to back, a URL works wherever a path does. To show it offline, these helpers run a
small HTTP server on ``127.0.0.1`` in a background thread of the current process:

    >>> with serve_directory(shard_folder) as base_url:      # doctest: +SKIP
    ...     dataset = TarShardDataset(f"{base_url}/shard-{{000000..000009}}.tar")

:func:`unresponsive_server` is the opposite: it accepts connections and never answers,
which is what a stalled server looks like to a client, and shows why every remote read
needs a timeout.
"""

from __future__ import annotations

import functools
import http.server
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files like ``python -m http.server`` but does not log every request to stderr."""

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


class _ServerThatLetsClientsLeave(http.server.ThreadingHTTPServer):
    """A threading HTTP server that treats a client hanging up mid-file as normal, not as an error.

    A training loop that stops early (a ``break``, a finished step count, a killed worker)
    closes its connections while the server is still sending; ``socketserver`` would print a
    ``BrokenPipeError`` traceback into the notebook for each one. Any other error is still printed.
    """

    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError, ...
            return
        super().handle_error(request, client_address)


@contextmanager
def serve_directory(folder: Path | str, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``folder`` over HTTP on a free port of ``host`` while the block runs.

    Yields the base URL (``http://127.0.0.1:<port>``). The server runs in a daemon
    thread, handles requests in parallel (DataLoader workers read several shards at
    once), and is shut down and its port released when the block ends, even on error.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot serve {folder}: not a folder")
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = _ServerThatLetsClientsLeave((host, 0), handler)  # port 0: the OS picks a free one
    thread = threading.Thread(target=server.serve_forever, name=f"http-{folder.name}", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def unresponsive_server(host: str = "127.0.0.1") -> Iterator[str]:
    """A server that accepts TCP connections (the kernel does, from the listen backlog)
    but never sends a byte. Yields its base URL; a client without a timeout would wait forever."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((host, 0))
        listener.listen(16)
        yield f"http://{host}:{listener.getsockname()[1]}"
