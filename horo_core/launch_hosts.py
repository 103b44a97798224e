"""Pure helpers about the hosts of a job, shared by launcher detection (horo_core/launch_env.py),
``horo_core.basics.init`` and hororun: every rank's place among the hosts from their names
(Horovod's local and cross ranks), Slurm's compressed host and task lists, and the local address
that routes to a host.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from typing import Optional, Sequence

LOOPBACK_V4 = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where a rank sits among the hosts of a job (Horovod's definitions).

    ``local_rank``/``local_size``: position among and number of the ranks on this host.
    ``cross_rank``/``cross_size``: index of this host among, and number of, the hosts that have a
    rank with this ``local_rank``, hosts ordered by their lowest rank.
    """

    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int



# ----------------------------------------------------------------------------------------------
# Topology helpers.


def local_topologies(hostnames: Sequence[str]) -> list[Topology]:
    """Computes every rank's :class:`Topology` from the host each rank runs on.

    Args:
        hostnames: ``hostnames[r]`` is the host of rank ``r``.

    Returns:
        One :class:`Topology` per rank, in rank order.

    Raises:
        ValueError: if ``hostnames`` is empty.
    """
    if not hostnames:
        raise ValueError("hostnames must name the host of at least one rank")
    host_order: list[str] = []
    local_size: dict[str, int] = {}
    local_rank: list[int] = []
    for host in hostnames:
        if host not in local_size:
            host_order.append(host)
            local_size[host] = 0
        local_rank.append(local_size[host])
        local_size[host] += 1
    # hosts_with[l] lists, in host order, the hosts that have a rank with local rank l.
    max_local = max(local_size.values())
    hosts_with: list[list[str]] = [[] for _ in range(max_local)]
    for host in host_order:
        for lr in range(local_size[host]):
            hosts_with[lr].append(host)
    cross_index = [{h: i for i, h in enumerate(hosts)} for hosts in hosts_with]
    return [
        Topology(local_rank=lr, local_size=local_size[host],
                 cross_rank=cross_index[lr][host], cross_size=len(hosts_with[lr]))
        for host, lr in zip(hostnames, local_rank)
    ]


def compute_local_topology(hostnames: Sequence[str], rank: int) -> tuple[int, int, int, int]:
    """Computes one rank's place among the hosts, as Horovod defines it.

    Args:
        hostnames: ``hostnames[r]`` is the host of rank ``r`` (gathered from every rank).
        rank: the rank to compute for.

    Returns:
        ``(local_rank, local_size, cross_rank, cross_size)`` where ``cross_rank`` is the index of
        this host among the hosts having this ``local_rank`` (hosts ordered by lowest rank).

    Raises:
        ValueError: if ``rank`` is out of range or ``hostnames`` is empty.
    """
    if not 0 <= rank < len(hostnames):
        raise ValueError(f"rank {rank} is out of range for {len(hostnames)} hostnames")
    t = local_topologies(hostnames)[rank]
    return t.local_rank, t.local_size, t.cross_rank, t.cross_size


# ----------------------------------------------------------------------------------------------
# Slurm list syntax.


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in Slurm host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in Slurm host list {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range_list(body: str, source: str) -> list[str]:
    values = []
    for item in body.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise ValueError(f"bad range {item!r} in Slurm host list {source!r}")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            values.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in Slurm host list {source!r}")
        width = len(lo)
        values.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return values


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """Expands a compressed Slurm host list.

    Args:
        nodelist: e.g. ``"gnode[10-12,20],login1,rack[1-2]-n[01-02]"``; zero padding is kept.

    Returns:
        The host names in order, e.g. ``["gnode10", "gnode11", "gnode12", "gnode20", "login1",
        "rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]``.

    Raises:
        ValueError: for malformed brackets or ranges.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        expansions = [""]
        pos = 0
        for m in re.finditer(r"\[([^\[\]]*)\]", item):
            literal = item[pos:m.start()]
            choices = _expand_range_list(m.group(1), nodelist)
            expansions = [e + literal + c for e in expansions for c in choices]
            pos = m.end()
        tail = item[pos:]
        if "[" in tail or "]" in tail:
            raise ValueError(f"unbalanced brackets in Slurm host list {nodelist!r}")
        hosts.extend(e + tail for e in expansions)
    return hosts


def expand_slurm_tasks_per_node(spec: str) -> list[int]:
    """Expands Slurm's tasks-per-node syntax.

    Args:
        spec: e.g. ``"2(x3),1"`` (the value of ``SLURM_STEP_TASKS_PER_NODE``).

    Returns:
        Tasks on each node in node order, e.g. ``[2, 2, 2, 1]``.

    Raises:
        ValueError: for malformed input.
    """
    counts: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise ValueError(f"bad Slurm tasks-per-node entry {item!r} in {spec!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


# ----------------------------------------------------------------------------------------------
# Addresses.


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def routable_address(target_host: Optional[str] = None, target_port: int = 9) -> str:
    """Returns the local address the kernel would use to reach ``target_host``.

    Uses an unconnected UDP socket's ``connect`` (no packet is sent). Without a target it picks
    the interface of the default route.

    Args:
        target_host: the host to reach; None for the default route.
        target_port: any port; only routing matters.

    Returns:
        ``"127.0.0.1"`` when the target is loopback, else the local IP address.

    Raises:
        OSError: if no route exists; the message suggests setting ``HORO_BIND_ADDR``.
    """
    if target_host is not None and _is_loopback(target_host):
        return LOOPBACK_V4
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never answers, but routing to it follows the default.
    host = "192.0.2.1" if target_host is None else target_host
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, target_port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError as e:
        what = "the default route" if target_host is None else repr(target_host)
        raise OSError(f"cannot find a local address that routes to {what}: {e}; set "
                      f"HORO_BIND_ADDR to the address this host should listen on") from e
