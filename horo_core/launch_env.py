"""Works out who this process is from the environment its launcher left behind.

This module is the one place that reads launcher environment variables. :func:`detect` takes the
first family that is present, in this order (ECOSYSTEM.md §1.2):

 1. ``HORO_*``          hororun
 2. ``HOROVOD_*``       horovodrun --gloo, Ray, Spark: recognised so that ``init`` can refuse them by
                        name (their rendezvous is Horovod's unauthenticated HTTP store)
 3. torchrun           ``RANK``/``WORLD_SIZE`` (+``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, ``MASTER_*``)
 4. Open MPI           ``OMPI_COMM_WORLD_*``
 5. PMIx               ``PMIX_RANK``
 6. MPICH / Intel MPI  ``PMI_RANK``/``PMI_SIZE`` (+``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``)
 7. MVAPICH2           ``MV2_COMM_WORLD_*``
 8. Slurm              only inside an ``srun`` step
 9. ``TF_CONFIG``
10. otherwise a single process (rank 0 of 1)

Launcher variables beat Slurm's: ``mpirun`` or ``torchrun`` inside an ``sbatch`` allocation leaves
``SLURM_*`` describing the batch step, not the rank. Except when srun itself is the MPI launcher
(``srun --mpi=pmix`` or ``pmi2``: the MPI variables give the step's own rank and size): Slurm's
route then, which needs no mpi4py.

The rendezvous that rank 0 hosts listens on torchrun's ``MASTER_PORT + 1``, TF_CONFIG's first port
+ 1, or under srun on ``15000 + (job id * 16 + step id) % 17000`` (steps of one job may run at once). A family with some but not all of its required
variables raises :class:`ValueError` naming what is missing.

Modifiers honoured by every family: ``HORO_HOSTNAME`` (the host this rank reports, for local
ranks and same-host detection, over the launcher's local numbers; hororun sets it itself);
``HORO_SECRET`` (then ``HOROVOD_SECRET``), hex; ``HORO_BIND_ADDR``
(the data-plane bind address); ``HORO_RENDEZVOUS_ADDR``/``HORO_RENDEZVOUS_PORT`` (move the rendezvous
that rank 0 hosts under torchrun, Slurm and TF_CONFIG).

The helpers about hosts it uses (every rank's place from the host names, Slurm's compressed lists,
the address that routes to a host) are in horo_core/launch_hosts.py and importable from here too.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import ipaddress
import json
import os
import re
import socket
from typing import Callable, Mapping, Optional, Sequence

from horo_core.launch_hosts import (LOOPBACK_V4, Topology, compute_local_topology, expand_slurm_nodelist,
                                    expand_slurm_tasks_per_node, local_topologies, routable_address)

__all__ = [
    "LaunchInfo",
    "Topology",
    "detect",
    "compute_local_topology",
    "cross_of_nodes",
    "local_topologies",
    "expand_slurm_nodelist",
    "expand_slurm_tasks_per_node",
    "routable_address",
    "HORO_KV",
    "HOROVOD_HTTP",
]

HORO_KV = "horo-kv"
"""Rendezvous protocol of :class:`horo_core.kvstore.KVServer`."""
HOROVOD_HTTP = "horovod-http"
"""Rendezvous protocol of Horovod's unauthenticated HTTP KV store (``PUT/GET /<scope>/<key>``)."""

_SLURM_PORT_BASE = 15000
_SLURM_PORT_RANGE = 17000  # ports 15000-31999, below Linux's ephemeral range
_SLURM_STEPS_PER_JOB = 16
_SLURM_SPECIAL_STEP_IDS = 4294967290  # batch, extern, interactive and pending steps are >= this


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """Everything a rank learns about itself from its launcher.

    Attributes:
        family: which launcher family matched: ``"hororun"``, ``"horovod"``, ``"torchrun"``,
            ``"openmpi"``, ``"pmix"``, ``"pmi"``, ``"mvapich"``, ``"slurm"``, ``"tf_config"`` or
            ``"single"``.
        rank: global rank, ``0 <= rank < size``.
        size: number of ranks.
        local_rank, local_size, cross_rank, cross_size: see :class:`Topology`; ``None`` when the
            launcher does not say. Then :attr:`topology_known` is False and the caller exchanges
            hostnames through the rendezvous and calls :func:`compute_local_topology`.
        hostname: this host's name as the launcher knows it (used for that exchange).
        rendezvous: ``(host, port)`` of the rendezvous, or None (single process, MPI families).
        rendezvous_protocol: :data:`HORO_KV` or :data:`HOROVOD_HTTP`; None when ``rendezvous`` is.
        hosts_rendezvous: True when this process must itself start the ``KVServer`` (bound to
            ``rendezvous``; under MPI bootstrap bound to ``(bind_host, 0)``) before connecting.
        secret: the job secret, or None when the launcher gave none (MPI families without
            ``HORO_SECRET``: rank 0 generates one and broadcasts it).
        secret_is_weak: True when the secret was derived from a job id that other users of the
            cluster can see (torchrun, Slurm, TF_CONFIG without ``HORO_SECRET``): init replaces it
            with a private one when every rank is on one host (horo_core/local_secret.py), and
            warns otherwise.
        bind_host: local address for the data plane's listening sockets.
        needs_mpi_bootstrap: True for the MPI families: rank 0 starts the KV server on
            ``(bind_host, 0)`` and broadcasts its address and the secret over MPI.
        rendezvous_origin: where the port of a rendezvous that a rank hosts came from
            (``"torchrun's MASTER_PORT + 1"``, the Slurm rule, ``"HORO_RENDEZVOUS_PORT"``...), for
            the error when that port is taken; None otherwise.
        node: the launcher's index of this process's node where the cross rank and size need every
            rank's (torchrun's GROUP_RANK: its nodes may run different numbers of processes); the
            caller exchanges them and calls :func:`cross_of_nodes`. None otherwise.
    """

    family: str
    rank: int
    size: int
    local_rank: Optional[int]
    local_size: Optional[int]
    cross_rank: Optional[int]
    cross_size: Optional[int]
    hostname: str
    rendezvous: Optional[tuple[str, int]]
    rendezvous_protocol: Optional[str]
    hosts_rendezvous: bool
    secret: Optional[bytes] = dataclasses.field(repr=False)
    secret_is_weak: bool
    bind_host: str
    needs_mpi_bootstrap: bool
    rendezvous_origin: Optional[str] = None
    node: Optional[int] = None

    @property
    def topology_known(self) -> bool:
        """True when all four of local/cross rank/size came from the launcher."""
        return None not in (self.local_rank, self.local_size, self.cross_rank, self.cross_size)


# ----------------------------------------------------------------------------------------------
# Reading variables.


class _Env:
    """Typed access to one environment mapping."""

    def __init__(self, environ: Mapping[str, str]):
        self._environ = environ

    def has(self, name: str) -> bool:
        return self._environ.get(name, "") != ""

    def any(self, *names: str) -> bool:
        return any(self.has(n) for n in names)

    def text(self, name: str) -> Optional[str]:
        value = self._environ.get(name, "")
        return value if value != "" else None

    def integer(self, name: str) -> Optional[int]:
        value = self.text(name)
        if value is None:
            return None
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError(f"{name}={value!r} is not an integer") from None

    def require(self, family: str, *names: str) -> None:
        missing = [n for n in names if not self.has(n)]
        if missing:
            present = [n for n in names if self.has(n)]
            raise ValueError(f"incomplete {family} launch environment: {', '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} not set"
                             + (f" (found {', '.join(present)})" if present else ""))

    def pair(self, family: str, a: str, b: str) -> Optional[tuple[str, str]]:
        """Both or neither of two variables; returns their values or None."""
        if self.has(a) != self.has(b):
            self.require(family, a, b)
        if not self.has(a):
            return None
        return self._environ[a], self._environ[b]


def _port(value: str, name: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ValueError(f"{name}={port} is not a valid TCP port")
    return port


def _secret_from_env(env: _Env) -> Optional[bytes]:
    for name in ("HORO_SECRET", "HOROVOD_SECRET"):
        value = env.text(name)
        if value is None:
            continue
        try:
            secret = bytes.fromhex(value.strip())
        except ValueError:
            raise ValueError(f"{name} is not a hex string") from None  # never echo the value
        if len(secret) < 16:
            raise ValueError(f"{name} must encode at least 16 bytes, got {len(secret)}")
        return secret
    return None


def _weak_secret(family: str, job_value: str) -> bytes:
    return hashlib.sha256(f"horo-job-secret/1\0{family}\0{job_value}".encode()).digest()


@dataclasses.dataclass
class _Partial:
    """What a family's reader found; :func:`detect` completes it into a LaunchInfo."""

    family: str
    rank: int
    size: int
    local_rank: Optional[int] = None
    local_size: Optional[int] = None
    cross_rank: Optional[int] = None
    cross_size: Optional[int] = None
    hostname: Optional[str] = None
    rendezvous: Optional[tuple[str, int]] = None
    rendezvous_protocol: Optional[str] = None
    rendezvous_origin: Optional[str] = None
    hosts_rendezvous: bool = False
    weak_secret_source: Optional[str] = None
    needs_mpi_bootstrap: bool = False
    node: Optional[int] = None


def _hosted_rendezvous(env: _Env, p: _Partial, default_host: str, default_port: int, origin: str) -> None:
    """Sets the rendezvous rank 0 hosts, moved by HORO_RENDEZVOUS_ADDR/PORT when given, and where
    its port came from (for the error when it is taken)."""
    host = env.text("HORO_RENDEZVOUS_ADDR") or default_host
    port_text = env.text("HORO_RENDEZVOUS_PORT")
    if port_text:
        p.rendezvous, p.rendezvous_origin = (host, _port(port_text, "HORO_RENDEZVOUS_PORT")), "HORO_RENDEZVOUS_PORT"
    else:
        p.rendezvous, p.rendezvous_origin = (host, default_port), origin


# ----------------------------------------------------------------------------------------------
# One reader per family. Each returns None when its family is absent.


def _read_launcher_family(env: _Env, family: str, prefix: str, addr_var: str,
                          port_var: str, protocol: str) -> Optional[_Partial]:
    rank_var, size_var = prefix + "RANK", prefix + "SIZE"
    if not env.any(rank_var, size_var):
        return None
    env.require(family, rank_var, size_var)
    p = _Partial(family, env.integer(rank_var), env.integer(size_var),
                 local_rank=env.integer(prefix + "LOCAL_RANK"),
                 local_size=env.integer(prefix + "LOCAL_SIZE"),
                 cross_rank=env.integer(prefix + "CROSS_RANK"),
                 cross_size=env.integer(prefix + "CROSS_SIZE"),
                 hostname=env.text(prefix + "HOSTNAME"))
    endpoint = env.pair(family, addr_var, port_var)
    if endpoint is not None:
        p.rendezvous = (endpoint[0], _port(endpoint[1], port_var))
        p.rendezvous_protocol = protocol
    elif p.size > 1:
        env.require(family, addr_var, port_var)
    return p


def _read_hororun(env: _Env) -> Optional[_Partial]:
    p = _read_launcher_family(env, "hororun", "HORO_", "HORO_RENDEZVOUS_ADDR",
                              "HORO_RENDEZVOUS_PORT", HORO_KV)
    if p is not None and p.size > 1:
        env.require("hororun", "HORO_SECRET")
    return p


def _read_horovod(env: _Env) -> Optional[_Partial]:
    return _read_launcher_family(env, "horovod", "HOROVOD_", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                                 "HOROVOD_GLOO_RENDEZVOUS_PORT", HOROVOD_HTTP)


_MPI_RANK_AND_SIZE = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                      ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"))


def _refuse_leftover_torch_variables(env: _Env) -> bool:
    """RANK and WORLD_SIZE set by hand, without torchrun (which also sets TORCHELASTIC_RUN_ID),
    beat an MPI launcher's variables: when the two disagree on the rank or the world size they are
    leftovers of another launch, and each rank would train alone, or two ranks be one, silently.

    Returns:
        Whether an MPI launcher started this process (its variables agree with RANK/WORLD_SIZE).
    """
    if env.has("TORCHELASTIC_RUN_ID"):
        return False
    mine = (env.integer("RANK"), env.integer("WORLD_SIZE"))
    under_mpi = False
    for rank_var, size_var in _MPI_RANK_AND_SIZE:
        launched = (env.integer(rank_var), env.integer(size_var))
        for name, value, own in ((size_var, launched[1], mine[1]), (rank_var, launched[0], mine[0])):
            if value is not None and value != own:
                raise ValueError(f"RANK/WORLD_SIZE say rank {mine[0]} of {mine[1]}, but the MPI launcher's "
                                 f"{name} is {value}: unset RANK and WORLD_SIZE (left over from another launch?) "
                                 "or make them agree with the launcher")
        under_mpi = under_mpi or launched[1] is not None
    return under_mpi


def _read_torchrun(env: _Env) -> Optional[_Partial]:
    if not env.any("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        return None
    env.require("torchrun", "RANK", "WORLD_SIZE")
    if _refuse_leftover_torch_variables(env) and not env.any("MASTER_ADDR", "MASTER_PORT", "HORO_RENDEZVOUS_ADDR"):
        # Under mpirun with RANK/WORLD_SIZE exported from the MPI launcher's variables (DDP over
        # MPI with an init_method of its own): the MPI launcher's job.
        return None
    p = _Partial("torchrun", env.integer("RANK"), env.integer("WORLD_SIZE"),
                 local_rank=env.integer("LOCAL_RANK"), local_size=env.integer("LOCAL_WORLD_SIZE"))
    if p.local_rank is not None and p.local_size is not None:
        group_rank, group_size = env.integer("GROUP_RANK"), env.integer("GROUP_WORLD_SIZE")
        # With the same number of processes on every node the node index is the cross rank of every
        # local rank; nodes may run different numbers (--nproc-per-node of each agent), so init
        # corrects these from every rank's node (cross_of_nodes).
        if group_rank is not None and group_size is not None:
            p.cross_rank, p.cross_size, p.node = group_rank, group_size, group_rank
    if p.size > 1:
        master = env.pair("torchrun", "MASTER_ADDR", "MASTER_PORT")
        if master is None and not (env.has("HORO_RENDEZVOUS_ADDR")
                                   and env.has("HORO_RENDEZVOUS_PORT")):
            env.require("torchrun", "MASTER_ADDR", "MASTER_PORT")
        default_host = master[0] if master else ""
        default_port = _port(master[1], "MASTER_PORT") + 1 if master else 0
        _hosted_rendezvous(env, p, default_host, default_port, "torchrun's MASTER_PORT + 1")
        p.rendezvous_protocol = HORO_KV
        p.hosts_rendezvous = p.rank == 0
        p.weak_secret_source = env.text("TORCHELASTIC_RUN_ID") or (
            f"{p.rendezvous[0]}:{p.rendezvous[1]}")
    return p


def _read_mpi(family: str, rank_var: str, size_var: str, local_rank_var: str,
              local_size_var: str) -> Callable[[_Env], Optional[_Partial]]:
    def read(env: _Env) -> Optional[_Partial]:
        if not env.any(rank_var, size_var):
            return None
        env.require(family, rank_var, size_var)
        if family != "openmpi" and _srun_launched(env, env.integer(rank_var), env.integer(size_var)):
            return None
        return _Partial(family, env.integer(rank_var), env.integer(size_var),
                        local_rank=env.integer(local_rank_var), local_size=env.integer(local_size_var),
                        hosts_rendezvous=env.integer(rank_var) == 0, needs_mpi_bootstrap=True)
    return read


def _read_pmix(env: _Env) -> Optional[_Partial]:
    if not env.has("PMIX_RANK"):
        return None
    # PMIx hands the size out through its API only; a direct srun launch also exports it.
    size_var = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if env.has(n)), None)
    if size_var is None:
        raise ValueError("incomplete pmix launch environment: PMIX_RANK is set but the world "
                         "size is not (expected SLURM_STEP_NUM_TASKS or SLURM_NTASKS)")
    rank = env.integer("PMIX_RANK")
    if _srun_launched(env, rank, None):
        return None
    return _Partial("pmix", rank, env.integer(size_var), local_rank=env.integer("SLURM_LOCALID"),
                    hosts_rendezvous=rank == 0, needs_mpi_bootstrap=True)


def _slurm_step(env: _Env) -> Optional[int]:
    """The id of the srun step this process belongs to; None outside one (a batch script's own
    step is not an srun step)."""
    step = env.text("SLURM_STEP_ID") or env.text("SLURM_STEPID")
    if step is None or not env.has("SLURM_PROCID"):
        return None
    try:
        value = int(step)
    except ValueError:
        return None  # "batch", "extern", "interactive"
    return value if value < _SLURM_SPECIAL_STEP_IDS else None


def _in_srun_step(env: _Env) -> bool:
    return _slurm_step(env) is not None


def _srun_launched(env: _Env, rank: Optional[int], size: Optional[int]) -> bool:
    """Whether srun itself started this process under an MPI plugin (``srun --mpi=pmix`` or
    ``pmi2`` sets PMIx/PMI variables besides Slurm's): the step's rank and size are the MPI
    family's. Horo then takes Slurm's route, which needs no mpi4py. An MPI launcher run inside a
    step (``srun -n1 mpirun ...``) gives ranks and sizes that differ from the step's."""
    if not _in_srun_step(env):
        return False
    step_size = next((env.integer(n) for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
                      if env.has(n)), None)
    return rank == env.integer("SLURM_PROCID") and (size is None or size == step_size)


def _read_slurm(env: _Env) -> Optional[_Partial]:
    if not _in_srun_step(env):
        return None
    size_var = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
                     if env.has(n)), "SLURM_STEP_NUM_TASKS")
    nodelist_var = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                     "SLURM_NODELIST") if env.has(n)), "SLURM_STEP_NODELIST")
    env.require("slurm", "SLURM_PROCID", size_var, "SLURM_JOB_ID", nodelist_var)
    rank, size = env.integer("SLURM_PROCID"), env.integer(size_var)
    nodes = expand_slurm_nodelist(env.text(nodelist_var))
    if not nodes:
        raise ValueError(f"{nodelist_var} names no hosts")
    p = _Partial("slurm", rank, size, local_rank=env.integer("SLURM_LOCALID"))
    node_id = env.integer("SLURM_NODEID")
    tasks_spec = env.text("SLURM_STEP_TASKS_PER_NODE") or env.text("SLURM_TASKS_PER_NODE")
    if node_id is not None and not 0 <= node_id < len(nodes):
        raise ValueError(f"SLURM_NODEID={node_id} is out of range for the {len(nodes)} hosts of "
                         f"{nodelist_var}")
    if node_id is not None and tasks_spec and p.local_rank is not None:
        counts = expand_slurm_tasks_per_node(tasks_spec)
        if len(counts) == len(nodes):
            p.local_size = counts[node_id]
            having = [i for i, c in enumerate(counts) if c > p.local_rank]
            if node_id in having:
                p.cross_rank, p.cross_size = having.index(node_id), len(having)
    p.hostname = env.text("SLURMD_NODENAME") or (nodes[node_id] if node_id is not None else None)
    job_id = env.text("SLURM_JOB_ID")
    step_id = _slurm_step(env)
    # Job and step both pick the port and the key: two srun steps of one job may run at once
    # (``srun ... & srun ... & wait``), and each is a job of its own for Horo.
    digits = re.sub(r"\D", "", job_id)
    default_port = _SLURM_PORT_BASE + ((int(digits) if digits else 0) * _SLURM_STEPS_PER_JOB + step_id) \
        % _SLURM_PORT_RANGE
    _hosted_rendezvous(env, p, nodes[0], default_port,
                       f"Slurm job {job_id} step {step_id}: {_SLURM_PORT_BASE} + (job * {_SLURM_STEPS_PER_JOB} + "
                       f"step) % {_SLURM_PORT_RANGE}")
    p.rendezvous_protocol = HORO_KV
    if node_id is not None and p.local_rank is not None:
        p.hosts_rendezvous = node_id == 0 and p.local_rank == 0
    else:
        p.hosts_rendezvous = rank == 0
    p.weak_secret_source = f"{job_id}.{step_id}"
    return p


def _read_tf_config(env: _Env) -> Optional[_Partial]:
    text = env.text("TF_CONFIG")
    if text is None:
        return None
    try:
        config = json.loads(text)
        cluster, task = config["cluster"], config["task"]
        task_type, index = task["type"], int(task["index"])
        chiefs, workers = list(cluster.get("chief", [])), list(cluster.get("worker", []))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"TF_CONFIG is not a valid cluster spec: {e!r}") from None
    if task_type not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG task type {task_type!r} is not a Horo rank (only 'chief' and "
                         f"'worker' tasks run training)")
    members = chiefs + workers
    rank = index if task_type == "chief" else len(chiefs) + index
    if not members or not 0 <= rank < len(members):
        raise ValueError(f"TF_CONFIG task {task_type}:{index} is not in its cluster spec")
    hosts, first_port = [], None
    for member in members:
        host, _, port = str(member).rpartition(":")
        if not host:
            raise ValueError(f"TF_CONFIG member {member!r} is not host:port")
        hosts.append(host.strip("[]"))
        if first_port is None:
            first_port = _port(port, "TF_CONFIG port")
    t = local_topologies(hosts)[rank]
    p = _Partial("tf_config", rank, len(members), t.local_rank, t.local_size, t.cross_rank,
                 t.cross_size, hostname=hosts[rank])
    if p.size > 1:
        _hosted_rendezvous(env, p, hosts[0], first_port + 1, "TF_CONFIG's first port + 1")
        p.rendezvous_protocol = HORO_KV
        p.hosts_rendezvous = rank == 0
        p.weak_secret_source = json.dumps(cluster, sort_keys=True)
    return p


_FAMILIES: tuple[Callable[[_Env], Optional[_Partial]], ...] = (
    _read_hororun,
    _read_horovod,
    _read_torchrun,
    _read_mpi("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    _read_pmix,
    _read_mpi("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    _read_mpi("mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
              "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    _read_slurm,
    _read_tf_config,
)


def _validate(p: _Partial) -> None:
    if p.size < 1:
        raise ValueError(f"{p.family}: world size must be >= 1, got {p.size}")
    if not 0 <= p.rank < p.size:
        raise ValueError(f"{p.family}: rank {p.rank} is out of range for size {p.size}")
    for index, count, what in ((p.local_rank, p.local_size, "local"),
                               (p.cross_rank, p.cross_size, "cross")):
        if count is not None and not 1 <= count <= p.size:
            raise ValueError(f"{p.family}: {what} size {count} is out of range for size {p.size}")
        if index is not None and (index < 0 or (count is not None and index >= count)):
            raise ValueError(f"{p.family}: {what} rank {index} is out of range for {what} size "
                             f"{count}")


def _bind_host(env: _Env, p: _Partial) -> str:
    override = env.text("HORO_BIND_ADDR")
    if override is not None:
        return override
    if p.rendezvous is not None:
        return routable_address(p.rendezvous[0], p.rendezvous[1])
    if p.size == 1 or p.local_size == p.size:
        return LOOPBACK_V4
    try:
        return routable_address(None)
    except OSError:
        address = socket.gethostbyname(socket.gethostname())
        if ipaddress.ip_address(address).is_loopback:
            raise OSError("cannot find a non-loopback address for this multi-host job; set "
                          "HORO_BIND_ADDR") from None
        return address


def detect(environ: Optional[Mapping[str, str]] = None) -> LaunchInfo:
    """Describes this process from its launcher's environment variables.

    Args:
        environ: the environment to read; ``os.environ`` when None.

    Returns:
        A :class:`LaunchInfo` for the first launcher family present (see the module docstring).

    Raises:
        ValueError: a family is only partly set (the message names the missing variables), a
            value is malformed, or ranks/sizes are inconsistent.
        OSError: no local address routes to the rendezvous host (set ``HORO_BIND_ADDR``).
    """
    env = _Env(os.environ if environ is None else environ)
    partial = None
    for read in _FAMILIES:
        partial = read(env)
        if partial is not None:
            break
    if partial is None:
        partial = _Partial("single", 0, 1, 0, 1, 0, 1)
    _validate(partial)
    if env.has("HORO_HOSTNAME") and partial.family != "hororun":  # hororun's follows its own numbers
        # A host name given explicitly (hosts emulated on one machine, or a name the launcher's
        # nodes do not match) decides which ranks share a host, over the launcher's local numbers.
        partial.local_rank = partial.local_size = partial.cross_rank = partial.cross_size = partial.node = None
    if partial.size == 1 and partial.local_rank is None:
        partial.local_rank, partial.local_size, partial.cross_rank, partial.cross_size = 0, 1, 0, 1
    secret = _secret_from_env(env)
    weak = False
    if secret is None and partial.weak_secret_source is not None:
        secret, weak = _weak_secret(partial.family, partial.weak_secret_source), True
    return LaunchInfo(
        family=partial.family,
        rank=partial.rank,
        size=partial.size,
        local_rank=partial.local_rank,
        local_size=partial.local_size,
        cross_rank=partial.cross_rank,
        cross_size=partial.cross_size,
        # HORO_HOSTNAME overrides every family, as it does for the core's same-host detection.
        hostname=env.text("HORO_HOSTNAME") or partial.hostname or socket.gethostname(),
        rendezvous=partial.rendezvous,
        rendezvous_protocol=partial.rendezvous_protocol,
        hosts_rendezvous=partial.hosts_rendezvous,
        secret=secret,
        secret_is_weak=weak,
        bind_host=_bind_host(env, partial),
        needs_mpi_bootstrap=partial.needs_mpi_bootstrap,
        rendezvous_origin=partial.rendezvous_origin,
        node=partial.node,
    )


def cross_of_nodes(nodes: Sequence[int], rank: int) -> tuple[int, int]:
    """Horovod's cross rank and size of ``rank`` given every rank's node (ranks of a node numbered
    in rank order): among the nodes that run a process at this rank's position on its node, this
    node's place in node order, and how many they are."""
    position = sum(1 for q in range(rank) if nodes[q] == nodes[rank])
    counts = collections.Counter(nodes)
    having = sorted(n for n, count in counts.items() if count > position)
    return having.index(nodes[rank]), len(having)
