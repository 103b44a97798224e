"""A port for a server that a test (or the ranks it starts) will open later: the rendezvous of
ranks started by hand, torchrun's store, a KV server started after its client.

Asking the kernel for port 0 and closing the socket leaves a window in which any socket that binds
port 0 or connects out (xdist runs tests side by side) may be given the same port, and a client that
retries a connect to a port nobody listens on yet can even connect to itself when the kernel picks
that very port as its source. Ports below the ephemeral range are never handed out that way, so
one is picked there, at random, and checked to be free now.
"""
import random
import socket

_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_floor():
    try:
        with open(_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    floor = _ephemeral_floor()
    if floor - 1024 >= 2000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(max(1024, floor - 12000), floor)
            if _bindable(port):
                return port
    # No room below the ephemeral range (or all taken): the kernel's choice, with its small window.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
