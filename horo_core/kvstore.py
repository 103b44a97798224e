"""A small authenticated key-value store that ranks use to find each other.

One process (``hororun``, or rank 0 under torchrun/Slurm/MPI) runs a :class:`KVServer`; every rank
opens a :class:`KVClient`, publishes its data-plane address with ``set`` and reads the others' with a
blocking ``get``.

Wire protocol (``horo-kv/1``). Every frame is a 4-byte big-endian length followed by that many bytes;
a frame longer than the configured maximum ends the connection.

1. The server sends ``{"proto": "horo-kv/1", "nonce": <32 random bytes, base64>}``.
2. The client answers ``{"nonce": <its own 32 random bytes>, "proof": HMAC(secret, "client-proof" |
   server nonce | client nonce)}``. A wrong proof makes the server answer ``{"error": "rejected"}``
   and close; it keeps serving everyone else.
3. The server answers ``{"proof": HMAC(secret, "server-proof" | server nonce | client nonce)}`` so
   the client knows it talks to the real server too.
4. From then on each frame is ``HMAC(secret, "message" | server nonce | client nonce | direction |
   sequence number | payload)`` (32 bytes) followed by the JSON payload. Sequence numbers count
   frames per direction, so a tampered, replayed, reordered or dropped frame fails the check and
   the connection is closed.

Payloads are JSON objects; values travel as base64. Nothing is ever unpickled. The secret only
authenticates: payloads are not encrypted, so keep secrets out of values.

Requests are ``set``, ``get`` (waits on the server until the key exists or a timeout passes),
``add`` (an atomic integer counter stored as ASCII decimal, as torch's TCPStore does) and ``delete``.

Strangers cannot wear the server down: a connection must finish steps 1-3 within the handshake
timeout as a whole (one byte at a time does not extend it), at most MAX_PENDING_CONNECTIONS
connections may be in the handshake at once (a new one sheds the oldest), and running out of file
descriptors sheds the oldest instead of spinning on the listener.

This module holds the server; the client is in horo_core/kv_client.py (importable from here too),
the framing, proofs and errors in horo_core/kv_wire.py.
"""
from __future__ import annotations

import errno
import hmac
import logging
import math
import os
import selectors
import socket
import threading
import time
from typing import Callable, Iterable, Mapping, Optional

from horo_core.kv_wire import (CLIENT_TO_SERVER, DEFAULT_MAX_MESSAGE_BYTES, NONCE_BYTES, PROTOCOL,
                               SERVER_TO_CLIENT, KVAuthError, KVConnectionError, KVProtocolError,
                               KVRequestError, KVStoreError, KVTimeoutError, PeerClosed, Session, b64,
                               check_key, check_secret, decode_plain, encode_plain, format_endpoint, make_proof,
                               recv_frame, send_frame, unb64)
from horo_core.kv_client import KVClient

__all__ = [
    "KVServer",
    "KVClient",
    "KVStoreError",
    "KVAuthError",
    "KVTimeoutError",
    "KVConnectionError",
    "KVProtocolError",
    "KVRequestError",
    "PROTOCOL",
    "DEFAULT_MAX_MESSAGE_BYTES",
]

_log = logging.getLogger("horo.kvstore")

# Connections that have not proved the secret yet, at most (as the core's mesh builder allows).
MAX_PENDING_CONNECTIONS = 64
# Accept errors that mean the process is out of descriptors or memory, not that one peer failed.
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


# ----------------------------------------------------------------------------------------------
# Server.


class KVServer:
    """Serves the key-value store on one address, from daemon threads.

    Args:
        host: address to bind. Only this address is bound; pass ``"0.0.0.0"`` or ``"::"``
            explicitly to listen on every interface. An empty string is refused.
        port: TCP port; 0 picks a free one (see :attr:`address`).
        secret: the job secret (at least 16 bytes) every client must prove it knows.
        max_message_bytes: largest frame accepted from a client; bigger ones close the connection.
        handshake_timeout: seconds a connection may take, from its accept, to prove the secret.

    Raises:
        TypeError, ValueError: for an invalid secret or host.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: Optional[bytes] = None, *,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 handshake_timeout: float = 10.0):
        if secret is None:
            raise ValueError("KVServer needs the job secret")
        if not host:
            raise ValueError("host must be an address; pass '0.0.0.0' explicitly to listen on "
                             "every interface")
        self._secret = check_secret(secret)
        self._host = host
        self._port = int(port)
        self._max_message_bytes = int(max_message_bytes)
        self._handshake_timeout = float(handshake_timeout)
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._listener: Optional[socket.socket] = None
        self._address: Optional[tuple[str, int]] = None
        self._wakeup_r: Optional[socket.socket] = None
        self._wakeup_w: Optional[socket.socket] = None
        self._accept_thread: Optional[threading.Thread] = None
        self._connections: set[socket.socket] = set()
        # Connections in the handshake, oldest first, with the time by which they must finish it.
        self._pending: dict[socket.socket, float] = {}
        self._exhausted_logged = -math.inf
        self._state_lock = threading.Lock()
        self._stopping = False
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "KVServer":
        """Binds the listening socket and starts serving in daemon threads.

        Returns:
            self, so ``server = KVServer(...).start()`` works.

        Raises:
            OSError: if the address cannot be bound.
            RuntimeError: if the server was already started.
        """
        with self._state_lock:
            if self._started:
                raise RuntimeError("KVServer.start() called twice")
            self._started = True
        infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(sockaddr)
            listener.listen(1024)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        bound = listener.getsockname()
        self._address = (bound[0], bound[1])
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._accept_thread = threading.Thread(target=self._accept_loop, name="horo-kv-accept",
                                               daemon=True)
        self._accept_thread.start()
        _log.debug("rendezvous serving on %s", format_endpoint(*self._address))
        return self

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``; valid after :meth:`start`.

        Raises:
            RuntimeError: if the server has not been started.
        """
        if self._address is None:
            raise RuntimeError("KVServer has not been started")
        return self._address

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._started and not self._stopping

    def stop(self) -> None:
        """Stops accepting, closes every connection and wakes every waiter. Idempotent."""
        with self._state_lock:
            if self._stopping or not self._started:
                self._stopping = True
                return
            self._stopping = True
            connections = list(self._connections)
        with self._cond:
            self._cond.notify_all()
        if self._wakeup_w is not None:
            try:
                self._wakeup_w.send(b"x")
            except OSError:
                pass
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._accept_thread is not None and self._accept_thread is not threading.current_thread():
            self._accept_thread.join()
        for sock in (self._listener, self._wakeup_r, self._wakeup_w):
            if sock is not None:
                sock.close()

    def __enter__(self) -> "KVServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- in-process access (for the launcher that owns the server) -----------------------------

    def keys(self, prefix: str = "") -> list[str]:
        """Returns the keys currently stored that start with ``prefix``, sorted."""
        with self._cond:
            return sorted(k for k in self._data if k.startswith(prefix))

    def items(self, prefix: str = "") -> dict[str, bytes]:
        """Returns the keys currently stored that start with ``prefix``, with their values."""
        with self._cond:
            return {k: v for k, v in self._data.items() if k.startswith(prefix)}

    def wait_for_keys(self, keys: Iterable[str], timeout: Optional[float] = None,
                      min_present: Optional[int] = None) -> list[str]:
        """Blocks until enough of ``keys`` exist, the timeout passes or the server stops.

        Args:
            keys: the keys to watch.
            timeout: seconds to wait; None waits without limit.
            min_present: return once this many of ``keys`` exist; default all of them.

        Returns:
            The watched keys still missing when the wait ended, in the given order (empty when
            all exist). Check :attr:`running` to tell a stop from a timeout.
        """
        watched = list(keys)
        need = len(watched) if min_present is None else min_present
        self.wait_until(lambda stored: sum(k in stored for k in watched) >= need, timeout)
        with self._cond:
            return [k for k in watched if k not in self._data]

    def wait_until(self, condition: Callable[[Mapping[str, bytes]], bool], timeout: Optional[float] = None) -> None:
        """Blocks until ``condition(the stored keys and values)`` holds, the timeout passes or the
        server stops; condition runs under the store's lock, at each change."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or condition(self._data), timeout)

    def put(self, key: str, value: bytes) -> None:
        """Stores a key from this process, as a client's set does (its waiters wake)."""
        key = check_key(key)
        with self._cond:
            self._data[key] = bytes(value)
            self._cond.notify_all()

    # -- serving ---------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None and self._wakeup_r is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wakeup_r, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in sel.select(self._next_deadline()):
                    if key.fileobj is self._wakeup_r:
                        return
                    try:
                        conn, peer = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as e:
                        self._accept_failed(e)
                        continue
                    conn.setblocking(True)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    with self._state_lock:
                        if self._stopping:
                            conn.close()
                            return
                        if len(self._pending) >= MAX_PENDING_CONNECTIONS:
                            self._shed(next(iter(self._pending)), "too many connections in the handshake")
                        self._connections.add(conn)
                        self._pending[conn] = time.monotonic() + self._handshake_timeout
                    threading.Thread(target=self._serve_connection, args=(conn, peer),
                                     name="horo-kv-conn", daemon=True).start()
                self._shed_late()

    def _next_deadline(self) -> Optional[float]:
        """Seconds until the oldest handshake runs out (None: no connection is in one)."""
        with self._state_lock:
            if not self._pending:
                return None
            return max(0.0, next(iter(self._pending.values())) - time.monotonic())

    def _shed_late(self) -> None:
        now = time.monotonic()
        with self._state_lock:
            late = [conn for conn, deadline in self._pending.items() if deadline <= now]
            for conn in late:
                self._shed(conn, "it did not prove the job secret in time")

    def _shed(self, conn: socket.socket, why: str) -> None:
        """Ends a connection still in the handshake; its thread closes it. Under _state_lock."""
        del self._pending[conn]
        _log.debug("rendezvous dropped a connection: %s", why)
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _accept_failed(self, error: OSError) -> None:
        if error.errno not in _EXHAUSTED:
            _log.warning("rendezvous accept failed: %s", error)
            return
        # Out of descriptors: the listener stays readable, so accepting again at once would spin.
        # Free one by shedding the oldest handshake, and give its thread a moment to close it.
        now = time.monotonic()
        if now - self._exhausted_logged >= 10.0:
            self._exhausted_logged = now
            _log.warning("rendezvous accept failed: %s; dropping the oldest unauthenticated connection",
                         error)
        with self._state_lock:
            if self._pending:
                self._shed(next(iter(self._pending)), "out of file descriptors")
        time.sleep(0.05)

    def _serve_connection(self, conn: socket.socket, peer) -> None:
        peer_text = format_endpoint(peer[0], peer[1]) if isinstance(peer, tuple) else str(peer)
        try:
            conn.settimeout(self._handshake_timeout)
            session = self._handshake(conn, peer_text)
            with self._state_lock:
                # Shed meanwhile: its socket is shut down, and the first request below fails.
                self._pending.pop(conn, None)
            if session is None:
                return
            conn.settimeout(None)
            while not self._stopping:
                request = session.open(recv_frame(conn, self._max_message_bytes))
                reply = self._dispatch(request)
                if reply is None:  # server stopping while a get waited
                    return
                send_frame(conn, session.seal(reply))
        except KVProtocolError as e:
            _log.warning("rendezvous dropped the connection from %s: %s", peer_text, e)
        except (PeerClosed, OSError):
            pass
        finally:
            with self._state_lock:
                self._connections.discard(conn)
                self._pending.pop(conn, None)
            conn.close()

    def _handshake(self, conn: socket.socket, peer_text: str) -> Optional[Session]:
        server_nonce = os.urandom(NONCE_BYTES)
        send_frame(conn, encode_plain({"proto": PROTOCOL, "nonce": b64(server_nonce)}))
        hello = decode_plain(recv_frame(conn, 4096))
        client_nonce = unb64(hello.get("nonce"), "client nonce")
        proof = unb64(hello.get("proof"), "client proof")
        if len(client_nonce) != NONCE_BYTES:
            raise KVProtocolError("client nonce has the wrong length")
        expected = make_proof(self._secret, b"client-proof", server_nonce, client_nonce)
        if not hmac.compare_digest(proof, expected):
            _log.warning("rendezvous rejected a connection from %s: wrong job secret", peer_text)
            try:
                send_frame(conn, encode_plain({"error": "rejected"}))
            except OSError:
                pass
            return None
        server_proof = make_proof(self._secret, b"server-proof", server_nonce, client_nonce)
        send_frame(conn, encode_plain({"proof": b64(server_proof)}))
        return Session(self._secret, server_nonce, client_nonce,
                        send_direction=SERVER_TO_CLIENT, recv_direction=CLIENT_TO_SERVER)

    def _dispatch(self, request: dict) -> Optional[dict]:
        op = request.get("op")
        try:
            key = check_key(request.get("key"))
        except (TypeError, ValueError) as e:
            return {"ok": False, "error": "bad_request", "message": str(e)}
        if op == "set":
            value = unb64(request.get("value"), "value")
            with self._cond:
                self._data[key] = value
                self._cond.notify_all()
            return {"ok": True}
        if op == "get":
            timeout = request.get("timeout")
            if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                    or not math.isfinite(timeout) or timeout < 0):
                return {"ok": False, "error": "bad_request",
                        "message": "get timeout must be a finite number >= 0"}
            with self._cond:
                self._cond.wait_for(lambda: key in self._data or self._stopping, timeout)
                if key in self._data:
                    return {"ok": True, "value": b64(self._data[key])}
                if self._stopping:
                    return None
            return {"ok": False, "error": "timeout"}
        if op == "add":
            delta = request.get("delta")
            if not isinstance(delta, int) or isinstance(delta, bool):
                return {"ok": False, "error": "bad_request", "message": "add delta must be an int"}
            with self._cond:
                current = self._data.get(key, b"0")
                try:
                    total = int(current.decode("ascii")) + delta
                except (UnicodeDecodeError, ValueError):
                    return {"ok": False, "error": "bad_request",
                            "message": f"key {key!r} does not hold an integer counter"}
                self._data[key] = str(total).encode("ascii")
                self._cond.notify_all()
            return {"ok": True, "total": total}
        if op == "delete":
            with self._cond:
                existed = self._data.pop(key, None) is not None
            return {"ok": True, "existed": existed}
        return {"ok": False, "error": "bad_request", "message": f"unknown operation {op!r}"}
