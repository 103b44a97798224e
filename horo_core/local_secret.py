"""A job secret that only this user's processes on this host can learn.

Launchers such as torchrun give the ranks nothing private to derive a job secret from: the key
falls back to a value every rank is told (launch_env's weak secret), which others can read or, for
torchrun's default run id ``none``, know in advance. When every rank of the job runs on this host,
the rank that hosts the rendezvous makes 32 random bytes instead and hands them out on an abstract
Unix socket named after the user and the job. The kernel tells each end the other's user id
(``SO_PEERCRED``), and both refuse a peer of another user, so another user can at most take the
name first; that fails the job with an error naming it, as taking the rendezvous port would.
"""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import struct
import threading
import time

from horo_core.errors import HoroAuthError, HoroTimeoutError

_log = logging.getLogger("horo.local_secret")

SECRET_BYTES = 32
_RETRY_S = 0.02


def _name(job: str) -> str:
    """The abstract socket address of this user's job (a leading NUL: no file, gone with the socket)."""
    digest = hashlib.sha256(f"horo-local-secret/1\0{os.getuid()}\0{job}".encode()).hexdigest()[:40]
    return f"\0horo-secret-{digest}"


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def serve(job: str, clients: int, timeout: float) -> bytes:
    """Makes the secret and hands it to up to ``clients`` processes of this user that ask for it
    within ``timeout`` seconds (from a daemon thread). ``job`` names the job the same way on every
    rank. Returns the secret.

    Raises:
        HoroAuthError: the job's socket name is taken (another process, perhaps of another user).
    """
    secret = os.urandom(SECRET_BYTES)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_name(job))
        listener.listen(max(clients, 1))
    except OSError as e:
        listener.close()
        raise HoroAuthError(f"could not offer the job secret to the other ranks of this host: the socket name "
                            f"of this job is taken ({e.strerror}); set HORO_SECRET to the same random hex on "
                            "every rank instead") from None
    deadline = time.monotonic() + timeout
    threading.Thread(target=_hand_out, args=(listener, secret, clients, deadline), name="horo-local-secret",
                     daemon=True).start()
    return secret


def _hand_out(listener: socket.socket, secret: bytes, clients: int, deadline: float) -> None:
    given = 0
    with listener:
        while given < clients:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            listener.settimeout(left)
            try:
                conn, _ = listener.accept()
            except OSError:  # the deadline passed
                return
            with conn:
                uid = _peer_uid(conn)
                if uid != os.getuid():
                    _log.warning("refused the job secret to a process of user %d", uid)
                    continue
                try:
                    conn.sendall(secret)
                    given += 1
                except OSError:
                    pass


def fetch(job: str, timeout: float) -> bytes:
    """The secret that the hosting rank of ``job`` serves, waiting up to ``timeout`` seconds for it
    to start.

    Raises:
        HoroAuthError: the process serving the name belongs to another user.
        HoroTimeoutError: no process served the secret in time.
    """
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(_name(job))
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() >= deadline:
                    raise HoroTimeoutError(f"the rank that hosts the rendezvous did not offer the job secret on "
                                           f"this host within {timeout:g} s (HORO_START_TIMEOUT)") from None
                time.sleep(_RETRY_S)
                continue
            uid = _peer_uid(sock)
            if uid != os.getuid():
                raise HoroAuthError(f"the socket that should offer this job's secret belongs to user {uid}, not "
                                    "this job's user; set HORO_SECRET to the same random hex on every rank")
            sock.settimeout(max(deadline - time.monotonic(), 1.0))
            secret = b""
            try:
                while len(secret) < SECRET_BYTES:
                    chunk = sock.recv(SECRET_BYTES - len(secret))
                    if not chunk:
                        break
                    secret += chunk
            except OSError:
                pass
            if len(secret) == SECRET_BYTES:
                return secret
            # The server gave up on this connection (its deadline): try until ours.
            if time.monotonic() >= deadline:
                raise HoroTimeoutError("the job secret was cut short on this host")
            time.sleep(_RETRY_S)
