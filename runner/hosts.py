"""Host lists and rank assignment.

Hosts come from ``-H/--hosts "host1:2,host2:4"`` or a hostfile whose lines are ``host slots=N``
(Open MPI style) or ``host:N`` (MPICH/Intel MPI style); a bare ``host`` has one slot. Ranks fill the
hosts in order, as Horovod's ``get_host_assignments`` does.
"""
from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time
from typing import Sequence

from horo_core.launch_env import local_topologies

__all__ = ["HostSlots", "SlotInfo", "parse_hosts", "parse_hostfile", "get_host_assignments",
           "remote_hosts", "is_local_host"]

_HOSTNAME = re.compile(r"[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\]")


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """A host and how many ranks it may run."""

    hostname: str
    slots: int


@dataclasses.dataclass(frozen=True)
class SlotInfo:
    """Where one rank runs and its place in the job (Horovod's ``SlotInfo``)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def _host_slots(hostname: str, slots_text: str | None, where: str) -> HostSlots:
    if not _HOSTNAME.fullmatch(hostname):
        raise ValueError(f"{where}: {hostname!r} is not a host name")
    if slots_text is None:
        return HostSlots(hostname, 1)
    try:
        slots = int(slots_text)
    except ValueError:
        raise ValueError(f"{where}: slots {slots_text!r} of host {hostname!r} is not an "
                         f"integer") from None
    if slots < 0:  # 0: listed, and given no rank (as horovodrun takes it)
        raise ValueError(f"{where}: host {hostname!r} cannot have {slots} slots")
    return HostSlots(hostname, slots)


def _split_host_colon(item: str, where: str) -> HostSlots:
    host, sep, slots = item.rpartition(":")
    if not sep or host.endswith(":") or (host.count(":") and not host.startswith("[")):
        # no slots given ("host"), or a bare IPv6 address
        return _host_slots(item, None, where)
    return _host_slots(host, slots, where)


def _check_unique(hosts: Sequence[HostSlots], where: str) -> list[HostSlots]:
    seen: set[str] = set()
    for h in hosts:
        if h.hostname in seen:
            raise ValueError(f"{where}: host {h.hostname!r} is listed more than once")
        seen.add(h.hostname)
    if not hosts:
        raise ValueError(f"{where}: no hosts given")
    return list(hosts)


def parse_hosts(spec: str) -> list[HostSlots]:
    """Parses ``-H/--hosts``.

    Args:
        spec: comma-separated ``host[:slots]`` entries, e.g. ``"localhost:2,node2:4"``.

    Returns:
        The hosts in order.

    Raises:
        ValueError: for an empty list, a malformed entry or a repeated host.
    """
    items = [item.strip() for item in spec.split(",") if item.strip()]
    return _check_unique([_split_host_colon(item, "--hosts") for item in items], "--hosts")


def parse_hostfile(path: str) -> list[HostSlots]:
    """Parses a hostfile.

    Args:
        path: file with one host per line: ``host slots=N`` (other ``key=value`` fields such as
            ``max_slots`` are ignored), ``host:N`` or ``host``; ``#`` starts a comment.

    Returns:
        The hosts in file order.

    Raises:
        OSError: if the file cannot be read.
        ValueError: for a malformed line (named by number) or a repeated host.
    """
    hosts = []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{path}:{number}"
            fields = line.split()
            if len(fields) == 1:
                hosts.append(_split_host_colon(fields[0], where))
                continue
            options = {}
            for field in fields[1:]:
                key, sep, value = field.partition("=")
                if not sep:
                    raise ValueError(f"{where}: expected 'host slots=N', got {line!r}")
                options[key] = value
            hosts.append(_host_slots(fields[0], options.get("slots"), where))
    return _check_unique(hosts, path)


def get_host_assignments(hosts: Sequence[HostSlots], num_proc: int) -> list[SlotInfo]:
    """Assigns ranks to host slots, filling each host before the next.

    Args:
        hosts: the hosts, in order.
        num_proc: number of ranks to place.

    Returns:
        One :class:`SlotInfo` per rank, in rank order.

    Raises:
        ValueError: if ``num_proc < 1`` or the hosts have fewer slots than ``num_proc``.
    """
    if num_proc < 1:
        raise ValueError(f"the number of processes must be >= 1, got {num_proc}")
    total = sum(h.slots for h in hosts)
    if total < num_proc:
        raise ValueError(f"requested {num_proc} processes but the hosts provide only {total} "
                         f"slots ({', '.join(f'{h.hostname}:{h.slots}' for h in hosts)})")
    hostnames: list[str] = []
    for host in hosts:
        take = min(host.slots, num_proc - len(hostnames))
        hostnames.extend([host.hostname] * take)
    topologies = local_topologies(hostnames)
    return [SlotInfo(hostname=name, rank=rank, local_rank=t.local_rank, cross_rank=t.cross_rank,
                     size=num_proc, local_size=t.local_size, cross_size=t.cross_size)
            for rank, (name, t) in enumerate(zip(hostnames, topologies))]


def is_local_host(hostname: str) -> bool:
    """True for ``localhost``, a loopback address, this machine's own host name, an address of one
    of its interfaces (hostfiles are often written with IP addresses), or a name that resolves to
    such addresses only (an /etc/hosts alias, the full name where the machine calls itself by its
    short one), as horovodrun tells its local hosts by their addresses."""
    return not remote_hosts([HostSlots(hostname, 1)])


def _named_as_local(name: str) -> bool:
    """Whether name is this machine by its text alone (no lookup)."""
    if name in ("localhost", "localhost.localdomain", "::1") or name.startswith("127."):
        return True
    own = socket.gethostname().lower()
    return name in (own, own.split(".", 1)[0]) or _is_own_address(name)


def _is_own_address(name: str) -> bool:
    """Whether name is a literal IP address of this machine: only an own address can be bound."""
    try:
        family = socket.AF_INET6 if ":" in name else socket.AF_INET
        socket.inet_pton(family, name)
    except OSError:
        return False  # a host name, not an address
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((name, 0))
        except OSError:
            return False
    return True


_LOOKUP_TIMEOUT_S = 5.0


def _addresses_of(names: Sequence[str]) -> dict[str, set[str]]:
    """The addresses each name resolves to, looked up side by side; none for a name that does not
    resolve within _LOOKUP_TIMEOUT_S of the start (an unreachable DNS server must not hold the
    launch for the resolver's own minutes, once per name)."""
    found: dict[str, set[str]] = {}

    def look_up(name: str) -> None:
        try:
            found[name] = {info[4][0].split("%", 1)[0] for info in socket.getaddrinfo(name, None)}
        except (OSError, UnicodeError):
            pass

    lookups = [threading.Thread(target=look_up, args=(name,), name="hororun-lookup", daemon=True)
               for name in set(names)]
    for lookup in lookups:
        lookup.start()
    deadline = time.monotonic() + _LOOKUP_TIMEOUT_S
    for lookup in lookups:
        lookup.join(max(deadline - time.monotonic(), 0))
    return {name: set(found.get(name, ())) for name in names}


def remote_hosts(hosts: Sequence[HostSlots]) -> list[str]:
    """Returns the host names in ``hosts`` that are not this machine (see :func:`is_local_host`)."""
    def bare(name: str) -> str:
        return name.strip("[]").lower()

    def here(address: str) -> bool:
        return address.startswith("127.") or address == "::1" or _is_own_address(address)

    unknown = {h.hostname: bare(h.hostname) for h in hosts if not _named_as_local(bare(h.hostname))}
    addresses = _addresses_of(list(unknown.values()))
    return [name for name, key in unknown.items() if not (addresses[key] and all(map(here, addresses[key])))]
