"""Which CPUs each rank of this host may run on (``hororun --bind-to``).

A rank runs at least two busy threads: the framework's compute thread and Horo's background
thread, which moves and reduces the gradients. When a host's ranks fill its cores, the kernel
keeps moving those threads between cores, and a rank's threads lose their caches and wait behind
the other rank's threads; binding each rank to its own cores keeps every rank's threads together
(docs/benchmarks.md, "Ranks bound to their own cores", has the training measurements).

Modes:

* ``auto`` (the default): when two or more ranks share this host and there are at least as many
  physical cores as ranks among the CPUs hororun may use, each rank gets an equal share of whole
  cores (SMT siblings stay together). This is what Open MPI's ``mpirun`` does for two ranks
  (``--bind-to core``). With more ranks than cores, each rank gets one core, and ranks next to
  each other share one (ranks 0 and 1 on the first of 2 cores, 2 and 3 on the second, for 4
  ranks); unbound, the kernel kept moving the ranks between the cores, and which ranks happened
  to share a core set a small allreduce's latency for seconds at a time (a loop of 64-byte
  allreduces on 4 ranks and 2 cores: blocks at 12 to 35 us, and 300 us stretches after other work
  in the same processes; bound, 11-18 us in every block: docs/benchmarks.md, "More ranks than
  cores, bound"). Open MPI binds nothing when oversubscribed.
* ``core``: the shares of ``auto``, and an error when there are more ranks than physical cores.
* ``none``: no binding (Horovod's ``horovodrun``, which starts ``mpirun -bind-to none``).

The shares are contiguous in (package, core) order, so a rank's cores share a socket where they
can. Threads a rank starts inherit its CPUs, DataLoader workers included.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, Optional, Sequence

__all__ = ["BIND_MODES", "format_cpus", "physical_cores", "rank_cpu_sets"]

BIND_MODES = ("auto", "core", "none")

_TOPOLOGY = "/sys/devices/system/cpu/cpu{cpu}/topology/{item}"


def _read_sysfs(cpu: int, item: str) -> Optional[str]:
    try:
        with open(_TOPOLOGY.format(cpu=cpu, item=item)) as f:
            return f.read().strip()
    except OSError:
        return None


def _parse_cpu_list(text: str) -> set[int]:
    """Parses the kernel's CPU list format: ``0-3,8,10-11``."""
    cpus: set[int] = set()
    for part in text.split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def physical_cores(allowed: Sequence[int],
                   read: Callable[[int, str], Optional[str]] = _read_sysfs) -> list[list[int]]:
    """Groups CPUs into physical cores, in (package, core) order.

    Args:
        allowed: the CPUs to group (those this process may run on).
        read: reads ``topology/<item>`` of a CPU from sysfs (a parameter for tests); None when the
            file is missing, and then every CPU counts as a core of its own.

    Returns:
        One sorted list of CPUs per physical core; only CPUs in ``allowed`` appear.
    """
    allowed_set = set(allowed)
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(allowed_set):
        siblings_text = read(cpu, "thread_siblings_list")
        package_text = read(cpu, "physical_package_id")
        siblings = _parse_cpu_list(siblings_text) if siblings_text else {cpu}
        package = int(package_text) if package_text and package_text.lstrip("-").isdigit() else 0
        first_sibling = min(siblings & allowed_set or {cpu})
        cores.setdefault((package, first_sibling), []).append(cpu)
    return [sorted(cpus) for _, cpus in sorted(cores.items())]


def rank_cpu_sets(mode: str, local_size: int, allowed: Optional[Sequence[int]] = None,
                  read: Callable[[int, str], Optional[str]] = _read_sysfs) -> list[Optional[frozenset[int]]]:
    """The CPUs of each local rank of this host.

    Args:
        mode: ``auto``, ``core`` or ``none`` (see the module docstring).
        local_size: ranks on this host.
        allowed: CPUs hororun may use (default: its own affinity mask).
        read: sysfs reader, as for :func:`physical_cores`.

    Returns:
        For local ranks ``0..local_size-1``, a frozenset of CPUs, or None for "not bound".

    Raises:
        ValueError: an unknown mode, or ``core`` with more ranks than physical cores.
    """
    if mode not in BIND_MODES:
        raise ValueError(f"--bind-to must be one of {', '.join(BIND_MODES)}, got {mode!r}")
    unbound: list[Optional[frozenset[int]]] = [None] * local_size
    if mode == "none" or (mode == "auto" and local_size < 2):
        return unbound
    if allowed is None:
        allowed = sorted(os.sched_getaffinity(0))
    cores = physical_cores(allowed, read)
    if local_size > len(cores):
        if mode == "auto":
            return [frozenset(cores[local_rank * len(cores) // local_size]) for local_rank in range(local_size)]
        raise ValueError(f"--bind-to core: {local_size} ranks on this host but only {len(cores)} physical "
                         f"cores among the CPUs hororun may use ({format_cpus(allowed)}); use fewer ranks "
                         f"or --bind-to none")
    share, extra = divmod(len(cores), local_size)
    sets: list[Optional[frozenset[int]]] = []
    start = 0
    for local_rank in range(local_size):
        count = share + (1 if local_rank < extra else 0)
        sets.append(frozenset(cpu for core in cores[start:start + count] for cpu in core))
        start += count
    return sets


def format_cpus(cpus: Optional[Iterable[int]]) -> str:
    """``0-3,8`` for CPUs 0, 1, 2, 3 and 8; ``all`` for None (not bound)."""
    if cpus is None:
        return "all"
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
