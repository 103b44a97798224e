"""The job secret that the ranks of a single-host job share when the launcher gives them nothing
private (horo_core/local_secret.py): only processes of the same user get it."""
import os
import subprocess
import sys
import threading

import pytest

from horo_core import local_secret
from horo_core.errors import HoroAuthError, HoroTimeoutError

NOBODY = 65534
as_root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")

# Runs as another user: connects to the abstract name in argv[1] (hex) and prints how many bytes it got.
STRANGER_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(bytes.fromhex(sys.argv[1]).decode())
s.settimeout(10)
got = b""
while True:
    chunk = s.recv(64)
    if not chunk:
        break
    got += chunk
print(len(got), flush=True)
"""

# Runs as another user: holds the abstract name in argv[1] and serves 32 bytes of its choice.
SQUATTER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(bytes.fromhex(sys.argv[1]).decode())
s.listen()
print("listening", flush=True)
conn, _ = s.accept()
conn.sendall(b"x" * 32)
sys.stdin.readline()
"""


def as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def stranger_python():
    """A Python interpreter the other user may run (this one may sit in root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            if subprocess.run([candidate, "-c", "pass"], preexec_fn=as_nobody, timeout=60).returncode == 0:
                return candidate
        except OSError:
            pass
    pytest.skip("no Python interpreter that another user may run")


def test_ranks_of_one_user_share_one_random_secret():
    job = f"test\0{os.getpid()}\0shared"
    secret = local_secret.serve(job, clients=2, timeout=30)
    got = []
    threads = [threading.Thread(target=lambda: got.append(local_secret.fetch(job, 30))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == [secret, secret] and len(secret) == local_secret.SECRET_BYTES
    assert local_secret.serve(f"test\0{os.getpid()}\0other", clients=0, timeout=1) != secret


def test_a_rank_whose_server_never_comes_times_out_naming_the_setting():
    with pytest.raises(HoroTimeoutError, match="did not offer the job secret on this host within 0.2 s"):
        local_secret.fetch(f"test\0{os.getpid()}\0nobody serves", 0.2)


@as_root_only
def test_another_user_does_not_get_the_secret():
    job = f"test\0{os.getpid()}\0stranger"
    secret = local_secret.serve(job, clients=1, timeout=30)
    name = local_secret._name(job).encode().hex()
    stranger = subprocess.run([stranger_python(), "-c", STRANGER_CLIENT, name], capture_output=True, text=True,
                              timeout=60, preexec_fn=as_nobody)
    assert stranger.returncode == 0, stranger.stderr
    assert stranger.stdout.strip() == "0"  # closed without a byte
    assert local_secret.fetch(job, 10) == secret  # the refusal did not use up the rank's turn


@as_root_only
def test_a_name_taken_by_another_user_is_refused_on_both_ends():
    job = f"test\0{os.getpid()}\0squatted"
    name = local_secret._name(job).encode().hex()
    squatter = subprocess.Popen([stranger_python(), "-c", SQUATTER, name], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, preexec_fn=as_nobody)
    try:
        assert squatter.stdout.readline().strip() == "listening"
        with pytest.raises(HoroAuthError, match=f"belongs to user {NOBODY}, not this job's user; set HORO_SECRET"):
            local_secret.fetch(job, 10)
        with pytest.raises(HoroAuthError, match="the socket name of this job is taken"):
            local_secret.serve(job, clients=1, timeout=10)
    finally:
        squatter.communicate("\n", timeout=30)
