"""The client side of the rendezvous key-value store: a :class:`KVClient` connects to a
:class:`horo_core.kvstore.KVServer`, authenticates both ways, and then sends ``set``, ``get``,
``add`` and ``delete`` requests. kvstore.py describes the protocol and holds the server, kv_wire.py
the framing, proofs and errors.
"""
from __future__ import annotations

import hmac
import math
import os
import socket
import threading
import time
from typing import Optional

from horo_core.kv_wire import (CLIENT_TO_SERVER, DEFAULT_MAX_MESSAGE_BYTES, NONCE_BYTES, PROTOCOL,
                               SERVER_TO_CLIENT, KVAuthError, KVConnectionError, KVProtocolError,
                               KVRequestError, KVTimeoutError, PeerClosed, Session, b64, check_key,
                               check_secret, decode_plain, encode_plain, format_endpoint, make_proof,
                               recv_frame, send_frame, unb64)

# Extra seconds a client waits for a reply beyond the time the server may legitimately spend.
_REPLY_GRACE_S = 10.0


class KVClient:
    """A connection to a :class:`KVServer`. Thread-safe: requests are serialized.

    The constructor connects and authenticates, retrying refused or unreachable connections until
    ``timeout`` passes (the server may start after its clients).

    Args:
        host: server address.
        port: server port.
        secret: the job secret.
        timeout: seconds allowed to connect, and the default wait of :meth:`get`.
        max_message_bytes: largest reply accepted.

    Raises:
        KVAuthError: the server rejected the secret, or could not prove it knows it.
        KVConnectionError: the server could not be reached within ``timeout``.
        KVProtocolError: the peer is not a horo-kv server.
    """

    def __init__(self, host: str, port: int, secret: bytes, timeout: float = 30.0, *,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self._secret = check_secret(secret)
        self._host = host
        self._port = int(port)
        self._timeout = float(timeout)
        self._max_message_bytes = int(max_message_bytes)
        self._endpoint = format_endpoint(host, self._port)
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._session: Optional[Session] = None
        self._broken: Optional[str] = None
        self._connect()

    @property
    def endpoint(self) -> str:
        """``host:port`` of the server, for messages."""
        return self._endpoint

    def _connect(self) -> None:
        deadline = time.monotonic() + self._timeout
        delay = 0.02
        while True:
            remaining = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self._host, self._port),
                                                timeout=max(remaining, 0.001))
                break
            except OSError as e:
                if time.monotonic() + delay >= deadline:
                    raise KVConnectionError(
                        f"could not reach the rendezvous at {self._endpoint} within "
                        f"{self._timeout:g} s: {e}") from e
                time.sleep(delay)  # the server may not be listening yet: back off and retry
                delay = min(delay * 2, 0.5)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(max(deadline - time.monotonic(), 1.0))
            self._session = self._handshake(sock)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def _handshake(self, sock: socket.socket) -> Session:
        try:
            hello = decode_plain(recv_frame(sock, 4096))
            if hello.get("proto") != PROTOCOL:
                raise KVProtocolError(f"{self._endpoint} does not speak {PROTOCOL} "
                                      f"(got {hello.get('proto')!r})")
            server_nonce = unb64(hello.get("nonce"), "server nonce")
            if len(server_nonce) != NONCE_BYTES:
                raise KVProtocolError("server nonce has the wrong length")
            client_nonce = os.urandom(NONCE_BYTES)
            proof = make_proof(self._secret, b"client-proof", server_nonce, client_nonce)
            send_frame(sock, encode_plain({"nonce": b64(client_nonce), "proof": b64(proof)}))
            answer = decode_plain(recv_frame(sock, 4096))
        except PeerClosed:
            raise KVConnectionError(
                f"rendezvous at {self._endpoint} closed the connection during the handshake"
            ) from None
        except socket.timeout:
            raise KVConnectionError(
                f"rendezvous at {self._endpoint} did not complete the handshake") from None
        if answer.get("error") == "rejected":
            raise KVAuthError(f"rendezvous at {self._endpoint} rejected the job secret")
        server_proof = unb64(answer.get("proof"), "server proof")
        expected = make_proof(self._secret, b"server-proof", server_nonce, client_nonce)
        if not hmac.compare_digest(server_proof, expected):
            raise KVAuthError(
                f"rendezvous at {self._endpoint} could not prove it knows the job secret")
        return Session(self._secret, server_nonce, client_nonce,
                        send_direction=CLIENT_TO_SERVER, recv_direction=SERVER_TO_CLIENT)

    def _request(self, request: dict, reply_timeout: Optional[float]) -> dict:
        with self._lock:
            if self._broken is not None:
                raise KVConnectionError(self._broken)
            assert self._sock is not None and self._session is not None
            try:
                self._sock.settimeout(reply_timeout)
                send_frame(self._sock, self._session.seal(request))
                reply = self._session.open(recv_frame(self._sock, self._max_message_bytes))
            except KVProtocolError as e:
                self._break(f"connection to the rendezvous at {self._endpoint} is unusable: {e}")
                raise KVProtocolError(f"rendezvous at {self._endpoint}: {e}") from None
            except (PeerClosed, ConnectionResetError, BrokenPipeError):
                # A reset is a close too: a server that stops with this request unread resets the
                # connection instead of ending it.
                self._break(f"rendezvous at {self._endpoint} closed the connection")
                raise KVConnectionError(self._broken) from None
            except socket.timeout:
                self._break(f"rendezvous at {self._endpoint} stopped answering")
                raise KVTimeoutError(self._broken) from None
            except OSError as e:
                self._break(f"connection to the rendezvous at {self._endpoint} failed: {e}")
                raise KVConnectionError(self._broken) from e
        if not reply.get("ok"):
            if reply.get("error") == "timeout":
                return reply
            raise KVRequestError(f"rendezvous at {self._endpoint} refused {request.get('op')} "
                                 f"{request.get('key')!r}: {reply.get('message', reply)}")
        return reply

    def _break(self, reason: str) -> None:
        self._broken = reason
        if self._sock is not None:
            self._sock.close()

    def set(self, key: str, value: bytes) -> None:
        """Stores ``value`` under ``key``, replacing any previous value.

        Args:
            key: non-empty string of at most 4096 UTF-8 bytes.
            value: the bytes to store.

        Raises:
            TypeError, ValueError: invalid key or value type.
            KVConnectionError: the connection failed (also after an integrity failure).
        """
        check_key(key)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"value must be bytes, not {type(value).__name__}")
        self._request({"op": "set", "key": key, "value": b64(bytes(value))}, self._timeout)

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        """Returns the value of ``key``, waiting until some rank sets it.

        Args:
            key: the key.
            timeout: seconds to wait; None uses the client's ``timeout``; 0 checks once.

        Returns:
            The stored bytes.

        Raises:
            KVTimeoutError: the key did not appear in time (names the key and the wait).
            KVConnectionError: the connection failed.
        """
        check_key(key)
        wait = self._timeout if timeout is None else float(timeout)
        if not math.isfinite(wait) or wait < 0:
            raise ValueError(f"timeout must be a finite number >= 0, got {timeout!r}")
        start = time.monotonic()
        reply = self._request({"op": "get", "key": key, "timeout": wait}, wait + _REPLY_GRACE_S)
        if not reply.get("ok"):
            elapsed = time.monotonic() - start
            raise KVTimeoutError(f"key {key!r} did not appear at the rendezvous at "
                                 f"{self._endpoint} within {elapsed:.1f} s")
        return unb64(reply.get("value"), "value")

    def add(self, key: str, delta: int) -> int:
        """Atomically adds ``delta`` to the integer counter at ``key`` (missing counts as 0).

        Args:
            key: the counter's key; its value is ASCII decimal, readable with :meth:`get`.
            delta: the amount to add (may be negative).

        Returns:
            The counter's new value.

        Raises:
            KVRequestError: the key holds something that is not an integer.
            KVConnectionError: the connection failed.
        """
        check_key(key)
        if not isinstance(delta, int) or isinstance(delta, bool):
            raise TypeError(f"delta must be int, not {type(delta).__name__}")
        reply = self._request({"op": "add", "key": key, "delta": delta}, self._timeout)
        return int(reply["total"])

    def delete(self, key: str) -> bool:
        """Removes ``key``.

        Returns:
            True if the key existed.

        Raises:
            KVConnectionError: the connection failed.
        """
        check_key(key)
        reply = self._request({"op": "delete", "key": key}, self._timeout)
        return bool(reply.get("existed"))

    def close(self) -> None:
        """Closes the connection. Idempotent."""
        with self._lock:
            if self._broken is None:
                self._break("client is closed")

    def __enter__(self) -> "KVClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
