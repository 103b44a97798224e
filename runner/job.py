"""One hororun job: secret, rendezvous, per-rank environment, supervision.

:func:`run_job` is shared by the ``hororun`` command line and :func:`horo_runner.run`. It

1. places the ranks on the hosts (only this machine for now);
2. generates a 32-byte job secret and starts a :class:`~horo_core.kvstore.KVServer` on 127.0.0.1;
3. starts every worker with ``HORO_RANK``, ``HORO_SIZE``, ``HORO_LOCAL_RANK``, ``HORO_LOCAL_SIZE``,
   ``HORO_CROSS_RANK``, ``HORO_CROSS_SIZE``, ``HORO_HOSTNAME``, ``HORO_RENDEZVOUS_ADDR``,
   ``HORO_RENDEZVOUS_PORT``, ``HORO_SECRET`` (hex; in the environment only, never on a command line
   or in any message), ``PYTHONUNBUFFERED=1`` and the settings the caller passes;
4. watches the start: once the first rank has registered (set ``ready/<rank>`` in the rendezvous
   when its ``init()`` reaches it) every other rank must register within the start timeout, or the
   job fails naming those that did not, at once for a rank that exited with code 0 before it
   registered. A command that never uses Horo never registers and is not watched;
5. keeps the rendezvous up until every worker has exited.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import tempfile
from typing import IO, Mapping, Optional, Sequence

from horo_core.kvstore import KVServer

from .binding import format_cpus, rank_cpu_sets
from .hosts import HostSlots, SlotInfo, get_host_assignments, remote_hosts
from .local_exec import EXIT_NOTES_ENV, ExecOptions, JobResult, Monitor, Worker, execute

__all__ = ["JobSpec", "run_job", "READY_KEY", "SECRET_ENV"]

READY_KEY = "ready/{rank}"
"""Key a rank sets in the rendezvous when its init() reaches it, before it waits for the others."""
FINISHED_KEY = "finished/{rank}"
"""Key the launcher sets in the rendezvous when a rank's process exits with code 0."""
MEMBERS_KEY = "members/"
"""Prefix of the keys that init(comm=[ranks]) sets before ``ready/``: the ranks of its job, by comma."""
SECRET_ENV = "HORO_SECRET"
_SECRET_BYTES = 32


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What to run and how.

    Attributes:
        command: argv of every worker.
        num_proc: number of ranks.
        hosts: hosts and slots; None means ``localhost:<num_proc>``.
        settings_env: extra variables for every worker (tuning flags already translated).
        start_timeout: seconds every rank has to register after the first one did.
        output_dir: tee each rank's output to ``<dir>/rank.<r>/{stdout,stderr}``.
        prefix_timestamp: precede each output prefix with a timestamp.
        shown_ranks: if set, only these ranks' output is forwarded to the launcher's streams.
        verbose: describe the launch on stderr (never the secret).
        termination_grace_s: seconds between SIGTERM and SIGKILL on failure.
        bind_to: which CPUs each rank may use: ``auto``, ``core`` or ``none``
            (:mod:`horo_runner.binding`).
    """

    command: Sequence[str]
    num_proc: int
    hosts: Optional[Sequence[HostSlots]] = None
    settings_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    start_timeout: float = 30.0
    output_dir: Optional[str] = None
    prefix_timestamp: bool = False
    shown_ranks: Optional[frozenset[int]] = None
    verbose: bool = False
    termination_grace_s: float = 5.0
    bind_to: str = "auto"


_HOROVOD_MIRRORED = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")


def _worker_env(base: Mapping[str, str], slot: SlotInfo, settings: Mapping[str, str],
                rendezvous: tuple[str, int], secret_hex: str) -> dict[str, str]:
    env = dict(base)
    env.update(settings)
    env.update({
        "HORO_RANK": str(slot.rank),
        "HORO_SIZE": str(slot.size),
        "HORO_LOCAL_RANK": str(slot.local_rank),
        "HORO_LOCAL_SIZE": str(slot.local_size),
        "HORO_CROSS_RANK": str(slot.cross_rank),
        "HORO_CROSS_SIZE": str(slot.cross_size),
        "HORO_HOSTNAME": slot.hostname,
        "HORO_RENDEZVOUS_ADDR": rendezvous[0],
        "HORO_RENDEZVOUS_PORT": str(rendezvous[1]),
        SECRET_ENV: secret_hex,
        "PYTHONUNBUFFERED": "1",
    })
    # horovodrun's names for the same facts, which scripts read before init() (to pick a GPU, or to
    # log on rank 0 only). HORO_* win in launch_env.detect, so these never decide anything here.
    for name in _HOROVOD_MIRRORED:
        env["HOROVOD_" + name] = env["HORO_" + name]
    return env


def _start_watch(server: KVServer, size: int, timeout: float) -> Monitor:
    ready = [READY_KEY.format(rank=r) for r in range(size)]
    finished = [FINISHED_KEY.format(rank=r) for r in range(size)]

    def expected(stored: Mapping[str, bytes]) -> list[int]:
        """The ranks that must register: every rank, or those that the init(comm=[ranks]) calls list."""
        lists = [v.decode() for k, v in stored.items() if k.startswith(MEMBERS_KEY)]
        return sorted({int(r) for v in lists for r in v.split(",")}) if lists else list(range(size))

    def unsettled(stored: Mapping[str, bytes]) -> list[int]:
        """Those still to come: a rank is settled once it registered, or ended without (then it never will)."""
        return [r for r in expected(stored) if ready[r] not in stored and finished[r] not in stored]

    def watch() -> Optional[str]:
        server.wait_for_keys(ready, timeout=None, min_present=1)
        if not server.running:
            return None
        server.wait_until(lambda stored: not unsettled(stored), timeout)
        stored = server.items()
        if not server.running:
            return None
        ended = [r for r in expected(stored) if finished[r] in stored and ready[r] not in stored]
        if ended:
            return (f"{_ranks(ended)} exited with code 0 before registering with the rendezvous (in init()), "
                    "while the others wait there for every rank")
        missing = unsettled(stored)
        if missing:
            return (f"{_ranks(missing)} did not register with the rendezvous within {timeout:g} s of the "
                    f"first rank (--start-timeout)")
        return None
    return watch


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _describe(spec: JobSpec, slots: Sequence[SlotInfo], rendezvous: tuple[str, int],
              cpus: Sequence[Optional[frozenset[int]]], err: IO[str]) -> None:
    placement = ", ".join(f"{h}:{sum(1 for s in slots if s.hostname == h)}"
                          for h in dict.fromkeys(s.hostname for s in slots))
    err.write(f"hororun: rendezvous on {rendezvous[0]}:{rendezvous[1]}; starting "
              f"{spec.num_proc} processes on {placement}\n")
    for key in sorted(spec.settings_env):
        err.write(f"hororun:   {key}={spec.settings_env[key]}\n")
    if any(c is not None for c in cpus):
        err.write(f"hororun:   CPUs (--bind-to {spec.bind_to}): "
                  + ", ".join(f"rank {s.rank}: {format_cpus(c)}" for s, c in zip(slots, cpus)) + "\n")
    err.write(f"hororun:   command: {shlex.join(spec.command)}\n")
    err.flush()


def run_job(spec: JobSpec, stdout: Optional[IO[str]] = None,
            stderr: Optional[IO[str]] = None) -> JobResult:
    """Runs one job on this machine and returns how it ended.

    Args:
        spec: the job.
        stdout: stream for the workers' prefixed stdout (default ``sys.stdout``).
        stderr: stream for the workers' prefixed stderr and verbose output (default
            ``sys.stderr``).

    Returns:
        The :class:`~horo_runner.local_exec.JobResult`.

    Raises:
        ValueError: bad host list, too few slots, an empty command, remote hosts (not
            supported yet), or ``bind_to="core"`` with more ranks than cores.
    """
    if not spec.command:
        raise ValueError("no command to run")
    beyond = sorted(r for r in spec.shown_ranks or () if r >= spec.num_proc)
    if beyond:
        raise ValueError(f"--rank-filter names rank {beyond[0]}, but the job has ranks 0 to {spec.num_proc - 1}")
    hosts = list(spec.hosts) if spec.hosts else [HostSlots("localhost", spec.num_proc)]
    remote = remote_hosts(hosts)
    if remote:
        raise ValueError(f"remote hosts are not supported yet: {', '.join(remote)} (only this "
                         f"machine: localhost, its host name or addresses, or a name that resolves only to them)")
    slots = get_host_assignments(hosts, spec.num_proc)
    # Every host is this machine (even under other names): all ranks share its CPUs.
    cpus = rank_cpu_sets(spec.bind_to, len(slots))
    err = stderr or sys.stderr
    secret_hex = os.urandom(_SECRET_BYTES).hex()
    with KVServer("127.0.0.1", 0, bytes.fromhex(secret_hex)) as server, \
            tempfile.TemporaryDirectory(prefix="hororun-exits-") as notes:
        rendezvous = server.address
        if spec.verbose:
            _describe(spec, slots, rendezvous, cpus, err)
        settings = {**spec.settings_env, EXIT_NOTES_ENV: notes}
        workers = [Worker(s.rank, spec.command, _worker_env(os.environ, s, settings, rendezvous, secret_hex), cpus[i])
                   for i, s in enumerate(slots)]

        def note_exit(rank: int, code: int) -> None:
            if code == 0:  # the start watch's to see; a failure ends the job anyway
                server.put(FINISHED_KEY.format(rank=rank), b"0")

        options = ExecOptions(output_dir=spec.output_dir, prefix_timestamp=spec.prefix_timestamp,
                              shown_ranks=spec.shown_ranks,
                              termination_grace_s=spec.termination_grace_s, exit_notes_dir=notes,
                              on_exit=note_exit)
        return execute(workers, options, monitors=[_start_watch(server, spec.num_proc,
                                                                spec.start_timeout)],
                       stdout=stdout, stderr=stderr)
