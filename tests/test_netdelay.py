"""The user-space delay proxy: its delay, its counts, and that it stops cleanly (a tiny HTTP server behind it)."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from packlab import netdelay

BODY = bytes(range(256)) * 400  # 102,400 bytes


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


def get(connection: http.client.HTTPConnection, path="/x") -> tuple[float, bytes]:
    """(seconds to the first byte of the response, body) for one GET on ``connection``."""
    start = time.monotonic()
    connection.request("GET", path)
    response = connection.getresponse()
    first = time.monotonic() - start
    return first, response.read()


def test_a_request_on_a_kept_connection_waits_one_round_trip_and_everything_is_counted(upstream):
    with netdelay.DelayProxy(upstream, rtt_ms=50) as proxy:
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        waits = []
        for _ in range(3):
            first, body = get(connection)
            assert body == BODY
            waits.append(first)
        connection.close()
        time.sleep(0.1)
        stats = proxy.stats()
    assert 0.100 <= waits[0] < 0.200  # a new connection: the handshake's round trip, then the request's
    assert all(0.050 <= w < 0.120 for w in waits[1:]), waits
    assert stats["connections"] == 1 and stats["requests"] == 3 and stats["methods"] == {"GET": 3}
    assert stats["bytes_down"] > 3 * len(BODY) and stats["bytes_down"] < 3 * len(BODY) + 3 * 300
    assert 3 * len("GET /x HTTP/1.1\r\n") < stats["bytes_up"] < 3 * 200


def test_request_bodies_are_skipped_not_mistaken_for_requests(upstream):
    payload = b"GET / HTTP/1.1\r\n\r\n" * 1000  # a body that looks like requests
    with netdelay.DelayProxy(upstream, rtt_ms=0) as proxy:
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        connection.request("PUT", "/y", body=payload)
        assert connection.getresponse().read() == payload
        get(connection)
        connection.close()
        time.sleep(0.05)
        assert proxy.stats()["requests"] == 2 and proxy.stats()["methods"] == {"PUT": 1, "GET": 1}


def test_chunked_bodies_are_skipped():
    counter = netdelay.RequestCounter()
    stream = (b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nGET /\r\n3;x=1\r\n\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")
    for i in range(0, len(stream), 7):  # in awkward pieces
        counter.feed(stream[i:i + 7])
    assert counter.requests == 2 and dict(counter.methods) == {"POST": 1, "GET": 1}


def test_a_client_that_opens_a_connection_per_request_shows_as_many_connections(upstream):
    with netdelay.DelayProxy(upstream, rtt_ms=20) as proxy:
        start = time.monotonic()
        for _ in range(3):
            with urllib.request.urlopen(f"{proxy.endpoint}/z", timeout=10) as response:  # Connection: close
                assert response.read() == BODY
        seconds = time.monotonic() - start
        time.sleep(0.05)
        stats = proxy.stats()
    assert stats["connections"] == 3 and stats["requests"] == 3
    assert seconds >= 3 * 2 * 0.020  # each pays a handshake and a request round trip


def test_requests_in_flight_wait_out_their_round_trips_together(upstream):
    """The proxy delays each connection on its own: eight requests in flight overlap their round trips.

    Checked by overlap, not by comparing wall times (a loaded machine may slow either run):
    each request takes at least the round trip, and while one waits, others are in flight.
    """
    with netdelay.DelayProxy(upstream, rtt_ms=50) as proxy:
        local = threading.local()

        def one(_):
            if not hasattr(local, "connection"):
                local.connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            start = time.monotonic()
            ok = get(local.connection)[1] == BODY
            return ok, start, time.monotonic()

        sequential = [one(i) for i in range(8)]
        assert all(ok for ok, _, _ in sequential)
        assert all(end - start >= 0.050 for _, start, end in sequential)
        with ThreadPoolExecutor(8) as pool:
            concurrent = list(pool.map(one, range(8)))
        assert all(ok for ok, _, _ in concurrent)
        # The most requests in flight at one moment: at a request's start, those begun and not yet done.
        in_flight = max(sum(1 for _, s, e in concurrent if s <= start < e) for _, start, _ in concurrent)
        assert in_flight >= 4, concurrent


def test_pacing_limits_the_rate(upstream):
    with netdelay.DelayProxy(upstream, rtt_ms=0, mbps=8) as proxy:  # 1 MB/s
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        start = time.monotonic()
        assert get(connection)[1] == BODY
        assert time.monotonic() - start >= 0.08  # 102 kB at 1 MB/s: about 0.1 s
        connection.close()


def test_the_proxy_stops_cleanly_no_thread_and_no_port_left(upstream):
    proxy = netdelay.DelayProxy(upstream, rtt_ms=10).start()
    port = proxy.port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    get(connection)  # leaves an open keep-alive connection behind
    proxy.stop()
    assert not proxy.running
    assert not [t for t in threading.enumerate() if t.name.startswith("DelayProxy")]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    connection.close()
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: closed connections may linger
    probe.bind(("127.0.0.1", port))  # nothing listens on the port any more
    probe.listen()
    probe.close()


def test_netem_check_answers_without_side_effects():
    assert netdelay.netem_available() in (True, False)
    assert "DelayProxy" in netdelay.latency_mechanism()
    assert netdelay.upstream_of("http://127.0.0.1:8333") == ("127.0.0.1", 8333)
