"""Wire format of the rendezvous key-value store (``horo-kv/1``): framing, the mutual HMAC handshake
proofs and per-message authentication, plus the store's error types. See ``horo_core.kvstore`` for
the protocol description and the server and client built on these pieces."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import socket
import struct

PROTOCOL = "horo-kv/1"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_KEY_BYTES = 4096
NONCE_BYTES = 32
MAC_BYTES = 32
MIN_SECRET_BYTES = 16
_LENGTH = struct.Struct(">I")
CLIENT_TO_SERVER = b"C"
SERVER_TO_CLIENT = b"S"


class KVStoreError(Exception):
    """Base class of every error raised by the key-value store."""


class KVAuthError(KVStoreError, PermissionError):
    """The two sides do not share the same job secret."""


class KVTimeoutError(KVStoreError, TimeoutError):
    """A blocking operation did not complete in time."""


class KVConnectionError(KVStoreError, ConnectionError):
    """The server cannot be reached or closed the connection."""


class KVProtocolError(KVConnectionError):
    """A frame failed its integrity check or broke the protocol; the connection is closed."""


class KVRequestError(KVStoreError, ValueError):
    """The server refused a well-formed request (e.g. ``add`` on a non-integer value)."""


class PeerClosed(Exception):
    """The peer closed the connection (internal)."""


# ----------------------------------------------------------------------------------------------
# Framing and message authentication shared by both sides.


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed()
        got += k
    return bytes(buf)


def send_frame(sock: socket.socket, body: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(body)) + body)


def recv_frame(sock: socket.socket, max_bytes: int) -> bytes:
    (length,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    if length > max_bytes:
        raise KVProtocolError(f"peer sent a {length}-byte message; the limit is {max_bytes} bytes")
    return recv_exact(sock, length)


def encode_plain(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def decode_plain(body: bytes) -> dict:
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise KVProtocolError(f"malformed message: {e}") from None
    except RecursionError:  # nested too deep for the parser, e.g. thousands of '['
        raise KVProtocolError("malformed message: nested too deeply") from None
    if not isinstance(obj, dict):
        raise KVProtocolError("malformed message: not a JSON object")
    return obj


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise KVProtocolError(f"malformed message: {what} is not a base64 string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise KVProtocolError(f"malformed message: {what} is not valid base64") from None


def make_proof(secret: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, PROTOCOL.encode() + b" " + label + server_nonce + client_nonce,
                    hashlib.sha256).digest()


class Session:
    """Signs outgoing and verifies incoming frames of one authenticated connection."""

    def __init__(self, secret: bytes, server_nonce: bytes, client_nonce: bytes,
                 send_direction: bytes, recv_direction: bytes):
        self._secret = secret
        self._nonces = server_nonce + client_nonce
        self._send_direction = send_direction
        self._recv_direction = recv_direction
        self._send_seq = 0
        self._recv_seq = 0

    def _mac(self, direction: bytes, seq: int, payload: bytes) -> bytes:
        head = PROTOCOL.encode() + b" message" + self._nonces + direction + seq.to_bytes(8, "big")
        return hmac.new(self._secret, head + payload, hashlib.sha256).digest()

    def seal(self, obj: dict) -> bytes:
        payload = encode_plain(obj)
        mac = self._mac(self._send_direction, self._send_seq, payload)
        self._send_seq += 1
        return mac + payload

    def open(self, frame: bytes) -> dict:
        if len(frame) < MAC_BYTES:
            raise KVProtocolError("message too short to carry an authentication code")
        mac, payload = frame[:MAC_BYTES], frame[MAC_BYTES:]
        expected = self._mac(self._recv_direction, self._recv_seq, payload)
        if not hmac.compare_digest(mac, expected):
            raise KVProtocolError(
                f"message {self._recv_seq} failed its integrity check (tampered, replayed or "
                f"reordered)")
        self._recv_seq += 1
        return decode_plain(payload)


def check_secret(secret: object) -> bytes:
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"secret must be bytes, not {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
    return bytes(secret)


def check_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be str, not {type(key).__name__}")
    if not key:
        raise ValueError("key must not be empty")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"key is longer than {MAX_KEY_BYTES} bytes")
    return key


def format_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


