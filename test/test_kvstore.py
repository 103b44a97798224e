"""Tests of the authenticated rendezvous store (horo_core/kvstore.py) over loopback TCP."""
import base64
import json
import logging
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from free_ports import free_port
from horo_core.kvstore import (MAX_PENDING_CONNECTIONS, KVAuthError, KVClient, KVConnectionError, KVProtocolError,
                               KVRequestError, KVServer, KVTimeoutError)

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))


@pytest.fixture
def server():
    srv = KVServer("127.0.0.1", 0, SECRET).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = KVClient(*server.address, SECRET, timeout=10.0)
    yield c
    c.close()


def _frame(sock):
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            return None
        header += chunk
    (n,) = struct.unpack(">I", header)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return body


def _send(sock, body):
    sock.sendall(struct.pack(">I", len(body)) + body)


class FrameProxy:
    """A man in the middle that forwards frames and lets a test rewrite them.

    ``mutate(direction, index, frame) -> list of frames`` sees every frame; direction is "c2s" or
    "s2c" and index counts the frames of that direction from 0 (handshake included).
    """

    def __init__(self, target, mutate):
        self.target = target
        self.mutate = mutate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.sockets = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        try:
            downstream, _ = self.listener.accept()
        except OSError:
            return
        upstream = socket.create_connection(self.target)
        self.sockets += [downstream, upstream]
        threading.Thread(target=self._pump, args=(upstream, downstream, "s2c"), daemon=True).start()
        self._pump(downstream, upstream, "c2s")

    def _pump(self, src, dst, direction):
        index = 0
        try:
            while True:
                body = _frame(src)
                if body is None:
                    break
                for out in self.mutate(direction, index, body):
                    _send(dst, out)
                index += 1
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.listener.close()
        for s in self.sockets:
            s.close()
        self.thread.join()


def _flip_last_byte(frame):
    return frame[:-1] + bytes([frame[-1] ^ 0x01])


# ------------------------------------------------------------------------------------------------


def test_set_get_add_delete(client):
    client.set("a", b"hello")
    assert client.get("a") == b"hello"
    client.set("a", b"")
    assert client.get("a") == b""
    binary = bytes(range(256)) * 3
    client.set("bin/\u00e9", binary)
    assert client.get("bin/\u00e9") == binary
    assert client.add("counter", 5) == 5
    assert client.add("counter", -2) == 3
    assert client.get("counter") == b"3"
    assert client.delete("a") is True
    assert client.delete("a") is False
    with pytest.raises(KVTimeoutError):
        client.get("a", timeout=0)


def test_values_visible_across_clients_and_in_process(server, client):
    other = KVClient(*server.address, SECRET)
    try:
        other.set("ready/0", b"1")
        assert client.get("ready/0") == b"1"
    finally:
        other.close()
    assert server.keys("ready/") == ["ready/0"]
    assert server.wait_for_keys(["ready/0", "ready/1"], timeout=0) == ["ready/1"]


def test_get_times_out_naming_key_and_wait(client):
    with pytest.raises(KVTimeoutError) as info:
        client.get("addr/7", timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    message = str(info.value)
    assert "'addr/7'" in message and re.search(r"within \d+\.\d+ s", message), message


def test_blocking_get_wakes_when_another_rank_sets(server):
    # Every "rank" publishes its address and reads all others': gets block until the sets land.
    size = 8
    results = {}

    def rank_main(rank):
        with KVClient(*server.address, SECRET) as c:
            c.set(f"addr/{rank}", f"host:{1000 + rank}".encode())
            results[rank] = [c.get(f"addr/{r}", timeout=30) for r in range(size)]

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [f"host:{1000 + r}".encode() for r in range(size)]
    assert results == {r: expected for r in range(size)}


def test_add_is_atomic_under_concurrency(server):
    threads_n, per_thread = 8, 50

    def work():
        with KVClient(*server.address, SECRET) as c:
            for _ in range(per_thread):
                c.add("n", 1)

    threads = [threading.Thread(target=work) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with KVClient(*server.address, SECRET) as c:
        assert c.get("n") == str(threads_n * per_thread).encode()


def test_one_client_shared_by_threads(client):
    def work(i):
        for j in range(20):
            client.set(f"k/{i}/{j}", str(i * j).encode())
            assert client.get(f"k/{i}/{j}") == str(i * j).encode()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.get("k/3/19") == b"57"


def test_wrong_secret_is_rejected_and_server_keeps_serving(server, client, caplog):
    host, port = server.address
    with caplog.at_level(logging.WARNING, logger="horo.kvstore"):
        with pytest.raises(KVAuthError) as info:
            KVClient(host, port, OTHER_SECRET)
    assert isinstance(info.value, PermissionError)
    assert str(info.value) == f"rendezvous at {host}:{port} rejected the job secret"
    assert "wrong job secret" in caplog.text
    client.set("still", b"serving")
    with KVClient(host, port, SECRET) as fresh:
        assert fresh.get("still") == b"serving"


def test_client_rejects_server_that_cannot_prove_the_secret():
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor():
        conn, _ = listener.accept()
        with conn:
            _send(conn, json.dumps({"proto": "horo-kv/1",
                                    "nonce": base64.b64encode(os.urandom(32)).decode()}).encode())
            _frame(conn)  # the client's proof, which an impostor cannot check anyway
            _send(conn, json.dumps({"proof": base64.b64encode(os.urandom(32)).decode()}).encode())
            _frame(conn)

    t = threading.Thread(target=impostor)
    t.start()
    try:
        with pytest.raises(KVAuthError, match="could not prove it knows the job secret"):
            KVClient(*listener.getsockname(), SECRET, timeout=5)
    finally:
        t.join()
        listener.close()


def test_tampered_reply_is_detected_by_the_client(server):
    # s2c frames: 0 hello, 1 server proof, 2 reply to set, 3 reply to get -> tampered
    proxy = FrameProxy(server.address, lambda d, i, f: [_flip_last_byte(f)]
                       if (d, i) == ("s2c", 3) else [f])
    try:
        c = KVClient(*proxy.address, SECRET)
        c.set("k", b"value")
        with pytest.raises(KVProtocolError, match="integrity check"):
            c.get("k")
        with pytest.raises(KVConnectionError):  # the connection is unusable afterwards
            c.get("k")
        c.close()
    finally:
        proxy.close()


def test_tampered_request_is_dropped_and_server_keeps_serving(server, caplog):
    # c2s frames: 0 client proof, 1 set request -> tampered
    proxy = FrameProxy(server.address, lambda d, i, f: [_flip_last_byte(f)]
                       if (d, i) == ("c2s", 1) else [f])
    try:
        c = KVClient(*proxy.address, SECRET)
        with caplog.at_level(logging.WARNING, logger="horo.kvstore"):
            with pytest.raises(KVConnectionError, match="closed the connection"):
                c.set("k", b"evil")
        assert "integrity check" in caplog.text
        c.close()
    finally:
        proxy.close()
    with KVClient(*server.address, SECRET) as fresh:
        with pytest.raises(KVTimeoutError):
            fresh.get("k", timeout=0)
        fresh.set("k", b"good")
        assert fresh.get("k") == b"good"


def test_replayed_request_is_rejected(server, caplog):
    # c2s frame 1 (a set) is delivered twice: the copy has a stale sequence number.
    proxy = FrameProxy(server.address, lambda d, i, f: [f, f] if (d, i) == ("c2s", 1) else [f])
    try:
        c = KVClient(*proxy.address, SECRET)
        with caplog.at_level(logging.WARNING, logger="horo.kvstore"):
            c.set("k", b"once")
            with pytest.raises(KVConnectionError):
                c.get("k")
        assert "integrity check" in caplog.text
        c.close()
    finally:
        proxy.close()


def test_oversized_message_drops_only_that_connection():
    srv = KVServer("127.0.0.1", 0, SECRET, max_message_bytes=1024).start()
    try:
        with KVClient(*srv.address, SECRET) as big:
            with pytest.raises(KVConnectionError):
                big.set("big", b"x" * 4096)
        with KVClient(*srv.address, SECRET) as small:
            small.set("small", b"x" * 100)
            assert small.get("small") == b"x" * 100
    finally:
        srv.stop()


def test_garbage_from_unauthenticated_peer_is_dropped(server, client):
    with socket.create_connection(server.address) as raw:
        assert _frame(raw) is not None  # the hello
        _send(raw, b"\xff not json")
        assert _frame(raw) is None  # dropped without a reply
    with socket.create_connection(server.address) as raw:
        raw.sendall(struct.pack(">I", 1 << 30))  # announces a 1 GiB frame
        assert _frame(raw) is not None  # hello was already on its way
        assert _frame(raw) is None
    client.set("alive", b"1")
    assert client.get("alive") == b"1"


def test_deeply_nested_hello_is_dropped_without_a_traceback(server, client, caplog):
    with caplog.at_level(logging.WARNING, logger="horo.kvstore"):
        with socket.create_connection(server.address) as raw:
            assert _frame(raw) is not None  # the hello
            _send(raw, b"[" * 4000)  # deeper than the JSON parser's recursion limit
            assert _frame(raw) is None  # dropped without a reply
    assert any("malformed message: nested too deeply" in r.getMessage() for r in caplog.records), caplog.text
    client.set("alive", b"1")
    assert client.get("alive") == b"1"


def _closed_by_peer(sock, wait):
    """Whether the peer closes sock within wait seconds (reading and dropping what it sends)."""
    sock.settimeout(wait)
    try:
        while sock.recv(4096):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def test_handshake_timeout_bounds_the_whole_handshake():
    # A stranger sending one byte every 0.2 s never lets one read wait its full second, so before,
    # it was kept for as long as it dripped. The handshake as a whole gets a second: the server
    # closes the connection long before the 40 bytes below (8 s of dripping) are all sent.
    srv = KVServer("127.0.0.1", 0, SECRET, handshake_timeout=1.0).start()
    try:
        with socket.create_connection(srv.address) as raw:
            assert _frame(raw) is not None
            closed = False
            for byte in struct.pack(">I", 200) + b"x" * 36:
                try:
                    raw.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                if _closed_by_peer(raw, 0.2):
                    closed = True
                    break
            assert closed, "the dripping stranger was kept"
        with KVClient(*srv.address, SECRET, timeout=10.0) as c:
            c.set("alive", b"1")
    finally:
        srv.stop()


def test_strangers_beyond_the_pending_limit_shed_the_oldest(server, client):
    extra = 5
    strangers = []
    try:
        for _ in range(MAX_PENDING_CONNECTIONS + extra):
            raw = socket.create_connection(server.address)
            strangers.append(raw)
            assert _frame(raw) is not None  # accepted and greeted, in this order
        assert all(_closed_by_peer(raw, 5.0) for raw in strangers[:extra])
        assert not any(_closed_by_peer(raw, 0.05) for raw in strangers[extra:])
        client.set("alive", b"1")
        assert client.get("alive") == b"1"
    finally:
        for raw in strangers:
            raw.close()


_EXHAUSTED_SERVER = """
import logging, resource, sys, time
from horo_core.kvstore import KVServer
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
srv = KVServer("127.0.0.1", 0, bytes(range(32)), handshake_timeout=30.0).start()
print(srv.address[1], flush=True)
sys.stdin.readline()
srv.stop()
"""


def test_running_out_of_descriptors_sheds_strangers_instead_of_spinning():
    proc = subprocess.Popen([sys.executable, "-c", _EXHAUSTED_SERVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    strangers = []
    try:
        port = int(proc.stdout.readline())
        # More strangers than the server has descriptors left: the late ones wait in the backlog.
        for _ in range(60):
            strangers.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(1.0)
        with KVClient("127.0.0.1", port, SECRET, timeout=10.0) as c:
            c.set("alive", b"1")
            assert c.get("alive") == b"1"
    finally:
        for raw in strangers:
            raw.close()
        _, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0, err
    failures = err.count("rendezvous accept failed")
    assert 1 <= failures <= 3, f"{failures} accept failures logged:\n{err[:2000]}"


def test_add_on_non_integer_is_a_request_error(client):
    client.set("text", b"abc")
    with pytest.raises(KVRequestError, match="does not hold an integer") as info:
        client.add("text", 1)
    assert isinstance(info.value, ValueError)
    assert client.add("fresh", 2) == 2  # the connection survives a refused request


def test_invalid_arguments(client):
    with pytest.raises(ValueError):
        client.set("", b"x")
    with pytest.raises(TypeError):
        client.set("k", "not bytes")
    with pytest.raises(ValueError):
        client.get("k", timeout=-1)
    with pytest.raises(ValueError):
        KVServer("", 0, SECRET)
    with pytest.raises(ValueError):
        KVServer("127.0.0.1", 0, b"short")
    with pytest.raises(ValueError):
        KVServer("127.0.0.1", 0)


def test_binds_only_the_given_host(server):
    assert server.address[0] == "127.0.0.1"
    assert server.address[1] > 0


def test_stop_wakes_a_blocked_get_and_closes_clients():
    srv = KVServer("127.0.0.1", 0, SECRET).start()
    c = KVClient(*srv.address, SECRET)
    errors = []

    def waiter():
        try:
            c.get("never", timeout=60)
        except KVConnectionError as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    srv.stop()
    t.join()
    assert len(errors) == 1 and "closed the connection" in str(errors[0])
    assert not srv.running
    srv.stop()  # idempotent


def test_client_waits_for_a_server_that_starts_later():
    port = free_port()
    box = {}

    def connect():
        try:
            with KVClient("127.0.0.1", port, SECRET, timeout=30) as c:
                box["value"] = c.get("k")
        except Exception as e:  # surfaced by the assertion below
            box["error"] = e

    t = threading.Thread(target=connect)
    t.start()
    srv = KVServer("127.0.0.1", port, SECRET).start()
    try:
        with KVClient("127.0.0.1", port, SECRET) as setter:
            setter.set("k", b"v")
        t.join()
    finally:
        srv.stop()
    assert box == {"value": b"v"}


def test_unreachable_server_names_endpoint():
    port = free_port()
    with pytest.raises(KVConnectionError, match=f"could not reach the rendezvous at 127.0.0.1:{port}"):
        KVClient("127.0.0.1", port, SECRET, timeout=0.3)
