"""Process-wide lifecycle of Horo in Python: ``init``, ``shutdown``, topology queries and the
capability queries, shared by horo_torch and horo_tf.

``init`` works out who this process is (``launch_env.detect``), meets the other ranks through the
authenticated rendezvous (hororun's, or one that rank 0 hosts under torchrun/Slurm/MPI), lets the
core connect every pair of ranks, and registers static process sets. A one-rank job needs no
network at all.
"""
import atexit
import collections
import itertools
import json
import logging
import os
import re
import socket
import sys
import threading
import time

from horo_core import config, launch_env, local_secret
from horo_core.errors import (HoroAuthError, HoroInvalidArgument, HoroNotInitializedError, HoroPeerLostError,
                              HoroShutdownError, HoroTimeoutError)
from horo_core.kv_wire import KVAuthError, KVConnectionError, KVStoreError, KVTimeoutError
from horo_core.kvstore import KVClient, KVServer
from horo_core.init_sets import MPI_LAUNCHED, launched_by_mpi, listed_sets, register_static_sets
from horo_core.process_sets import ProcessSet, global_process_set
from horo_core.runtime import LoopbackHub, Runtime

logger = logging.getLogger("horo")

NOT_INITIALIZED = "Horo has not been initialized; use hvd.init()."


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.runtime = None
        self.hub = None
        self.kv_server = None
        # The rendezvous this rank hosts for torchrun-style launches (MASTER_ADDR:MASTER_PORT): kept
        # from one init() to the next, since the other ranks may come back to it before this rank
        # has shut down (keys carry the init's generation); stopped when the process exits.
        self.hosted_rendezvous = None
        self.rank = self.size = None
        self.local_rank = self.local_size = self.cross_rank = self.cross_size = None
        self.homogeneous = True
        self.dynamic = False
        self.listed_members = False  # init(comm=[ranks]): no communicator numbers the job's ranks
        self.process_sets = {}
        self.aliases = []  # listed process sets that stand for another set (see init)
        self.names = {}
        self.generation = itertools.count()
        self.atexit_registered = False
        self.forked_from = None  # in a process forked from an initialized rank: that rank (see _forget_in_child)
        self.closing = None  # the runtime that shutdown() is destroying, meanwhile


_state = _State()
# What a forked child inherited from the rank (see _forget_in_child), kept so that nothing of it is
# ever torn down in the child.
_inherited = []


def _forget_in_child():
    """A process forked from a rank (a DataLoader worker, a pool's, a plain os.fork()) is not part of
    the job. As in Horovod, it keeps the rank's place: rank(), size() and the other queries answer
    as in the rank (a worker may shard its data by them), is_initialized() is True and init() does
    nothing. But it cannot take part in the rank's collectives: the core's threads stayed in the
    rank, and driving its shared-memory rings from the child would corrupt the rank's job. So every
    collective, and every handle the child inherited, raises a HoroShutdownError that says so. Its
    exit (atexit's shutdown) frees nothing the rank still uses; what it inherited stays referenced
    and untouched."""
    rt = _state.runtime
    if rt is not None:
        _state.forked_from = _state.rank
    for runtime in (rt, _state.closing):  # closing: forked while another thread's shutdown() runs
        if runtime is not None:
            runtime.forsake_in_forked_child(
                f"Horo: this process (pid {os.getpid()}) was forked from rank {_state.rank} (pid {os.getppid()}) "
                "after init(). It may read the rank's topology (rank(), size(), ...), but collectives belong "
                "to the rank's process: a forked child cannot take part in them")
    _inherited.extend(x for x in (rt, _state.closing, _state.kv_server, _state.hub, _state.hosted_rendezvous)
                      if x is not None)
    _state.closing = None
    _state.kv_server = _state.hub = _state.hosted_rendezvous = None
    _state.lock = threading.RLock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_in_child)


def _stop_hosted_rendezvous():
    with _state.lock:
        kept, _state.hosted_rendezvous = _state.hosted_rendezvous, None
    if kept is not None:
        kept[1].stop()


def _rendezvous(info, mpi_comm, members, start_timeout):
    """Returns (host, port, secret, server) of the rendezvous this rank uses; members: the global
    ranks of init(comm=[...]), which alone take part (under MPI through a communicator of their own,
    so that nothing reaches the other ranks' MPI calls). The secret is the launcher's, except where
    that is weak and every rank runs on this host: then a random one shared by local_secret, which
    the ranks wait for up to start_timeout."""
    if info.needs_mpi_bootstrap or mpi_comm is not None:
        try:
            from mpi4py import MPI
        except ImportError:
            raise HoroInvalidArgument(
                f"launched by {info.family} without a rendezvous address; install mpi4py (pip install "
                "mpi4py) so that rank 0 can share one, or launch with hororun") from None
        if not MPI.Is_initialized():  # mpi4py.rc.initialize = False: Horovod initializes MPI then
            MPI.Init_thread()
            atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
        comm = mpi_comm or MPI.COMM_WORLD
        if mpi_comm is None and (comm.Get_rank(), comm.Get_size()) != (info.rank, info.size):
            # Each rank would start a rendezvous of its own and wait for peers that never come.
            raise HoroInvalidArgument(
                f"the launcher ({info.family}) says rank {info.rank} of {info.size}, but mpi4py's MPI says rank "
                f"{comm.Get_rank()} of {comm.Get_size()}: mpi4py is built against another MPI than the one "
                f"that launched this job ({MPI.Get_library_version().splitlines()[0].strip()}); install the "
                "mpi4py of the launcher's MPI, or launch with hororun")
        own = None
        if members is not None and mpi_comm is None:
            # Collective over the members only (MPI_Comm_create_group), as Horovod's comm=[ranks].
            group = MPI.COMM_WORLD.Get_group()
            members_group = group.Incl(members)
            try:
                own = comm = MPI.COMM_WORLD.Create_group(members_group)
            except NotImplementedError:
                raise HoroInvalidArgument(f"init(comm={members}) needs MPI_Comm_create_group (MPI 3), which this MPI "
                                          "lacks; pass an mpi4py communicator of those ranks instead") from None
            finally:
                members_group.Free()
                group.Free()
        try:
            server = None
            payload = None
            if comm.Get_rank() == 0:
                secret = info.secret or os.urandom(32)
                server = KVServer(info.bind_host, 0, secret).start()
                host, port = server.address
                payload = (host, port, secret.hex())
            host, port, secret_hex = comm.bcast(payload, root=0)
        finally:
            if own is not None:
                own.Free()
        return host, port, bytes.fromhex(secret_hex), server
    if info.rendezvous_protocol not in (None, launch_env.HORO_KV):
        raise HoroInvalidArgument(
            f"the launcher ({info.family}) offers a {info.rendezvous_protocol} rendezvous, which Horo does not "
            "speak (it is unauthenticated); launch with hororun, torchrun, mpirun or srun instead")
    host, port = info.rendezvous
    secret = info.secret
    private = info.secret_is_weak and info.local_size == info.size
    if private:
        # Every rank runs on this host: a random secret handed out to this user's processes only
        # replaces the one derived from what the launcher tells every rank.
        job = f"{info.family}\0{host}:{port}\0{info.secret.hex()}"
        if info.hosts_rendezvous:
            secret = local_secret.serve(job, info.size - 1, start_timeout)
        else:
            secret = local_secret.fetch(job, start_timeout)
    if info.hosts_rendezvous:
        kept = _state.hosted_rendezvous
        if kept is None or kept[0] != (host, port, secret):
            if kept is not None:
                kept[1].stop()
            _state.hosted_rendezvous = None
            try:
                server = KVServer(host, port, secret).start()
            except OSError as e:
                raise OSError(e.errno, f"rank {info.rank} could not listen for the rendezvous on {host}:{port} "
                                       f"(port from {info.rendezvous_origin}): {e.strerror}. Another job may hold "
                                       "it; set HORO_RENDEZVOUS_PORT to a free port on every rank") from e
            _state.hosted_rendezvous = ((host, port, secret), server)
            atexit.register(_stop_hosted_rendezvous)
    server = None  # the hosted rendezvous outlives this init; see _State
    if info.secret_is_weak and not private:
        logger.warning("horo: no HORO_SECRET set and the ranks span several hosts, so the job key is derived from "
                       "what %s tells every rank (its job id or rendezvous address), which others can read or "
                       "guess: whoever reaches %s:%s can join this job. Export the same random HORO_SECRET (python "
                       "-c 'import secrets; print(secrets.token_hex(32))') to every rank for a private key.",
                       info.family, host, port)
    return host, port, secret, server


def init(comm=None, process_sets=None):
    """Initializes Horo on this process; a no-op if already initialized, and in a process forked
    from an initialized rank (see _forget_in_child).

    Args:
        comm: None (every launched process), a list of global ranks that form the job (the others
            must not call init), or an mpi4py communicator whose members form the job.
        process_sets: a list of ProcessSet registered on every rank (the same sets of ranks on
            every rank; sets of MPI communicators may differ, as from comm.Split), or "dynamic" to
            allow add_process_set/remove_process_set later.
    Raises:
        ValueError: the launcher environment is inconsistent, or the process set arguments are invalid.
        HorovodInternalError: the ranks could not connect within the start timeout.
    """
    with _state.lock:
        if _state.runtime is not None or _state.forked_from is not None:  # (a forked child: not a rank)
            return
        info = launch_env.detect()
        rank, size = info.rank, info.size
        mpi_comm = None
        key_prefix = ""
        members = None
        if isinstance(comm, (list, tuple)):
            ranks = sorted(int(r) for r in comm)
            if len(set(ranks)) != len(ranks) or not all(0 <= r < size for r in ranks):
                raise HoroInvalidArgument(f"comm={list(comm)} must list distinct ranks of the job's 0..{size - 1}")
            if rank not in ranks:
                raise HoroInvalidArgument(f"rank {rank} is not in comm={ranks}; only those ranks may call init")
            if 0 not in ranks and info.rendezvous_origin is not None:  # rank 0 hosts it (torchrun, Slurm)
                raise HoroInvalidArgument(
                    f"comm={ranks} leaves out rank 0, which hosts the rendezvous under {info.family}; include "
                    "rank 0, or launch with hororun or mpirun")
            key_prefix = "comm" + "-".join(map(str, ranks)) + "/"
            members = ranks
            rank, size = ranks.index(rank), len(ranks)
        elif comm is not None:
            if not launched_by_mpi(info):
                raise HoroInvalidArgument(f"init(comm=<MPI communicator>) needs {MPI_LAUNCHED.format(info.family)}; "
                                          "call init() for every launched process, or init(comm=[ranks]) for some")
            mpi_comm = comm
            rank, size = comm.Get_rank(), comm.Get_size()
        settings = {s.name: s.value for s in config.settings()}
        _state.dynamic = process_sets == "dynamic" or config.as_bool(settings["DYNAMIC_PROCESS_SETS"])
        static_sets = [] if process_sets in (None, "dynamic") else list(process_sets)
        for ps in static_sets:
            if not isinstance(ps, ProcessSet):
                raise HoroInvalidArgument(f"process_sets must hold ProcessSet objects, got {ps!r}")
        start_timeout = float(settings["START_TIMEOUT"])
        listed = listed_sets(static_sets, info, mpi_comm, members, size)

        nodes = None  # every rank's node, where the launcher's cross values need them (LaunchInfo.node)
        generation = next(_state.generation)
        hostname = info.hostname or socket.gethostname()
        if size == 1:
            _state.hub = LoopbackHub(1)
            rt = Runtime(0, 1, loopback=_state.hub)
            rt.connect()
            hostnames, everyones_sets = [hostname], [listed]
            if info.rendezvous is not None and not info.hosts_rendezvous and info.secret:
                # hororun -np 1 still waits for the rank to register.
                with KVClient(*info.rendezvous, info.secret, timeout=start_timeout) as kv:
                    _report_arrival(kv, info, members, generation)
        else:
            host, port, secret, server = _rendezvous(info, mpi_comm, members, start_timeout)
            _state.kv_server = server
            rt = None
            kv = None
            try:
                kv = KVClient(host, port, secret, timeout=start_timeout)
                # This rank reached the rendezvous: hororun gives the others start_timeout from the
                # first such rank, then names those that did not come (runner/job.py); meanwhile
                # this rank waits a little longer, so that the launcher's message is the one seen.
                _report_arrival(kv, info, members, generation)
                wait = start_timeout + (_LAUNCHER_NAMES_LATE_RANKS_S if info.family == "hororun" else 0.0)
                rt = Runtime(rank, size, secret=secret, bind_host=info.bind_host)
                prefix = f"{key_prefix}init{generation}/"
                kv.set(f"{prefix}addr/{rank}", rt.address().encode())
                # With its host, each rank posts its process sets, which init checks and gathers.
                kv.set(f"{prefix}host/{rank}", json.dumps([hostname, listed]).encode())
                if info.node is not None and comm is None:  # the same on every rank: torchrun's
                    kv.set(f"{prefix}node/{rank}", str(info.node).encode())
                addresses = _gather(kv, f"{prefix}addr", size, wait, start_timeout, (host, port),
                                    lambda index: _same_job_or_raise(kv, info, members, generation, index))
                posted = [json.loads(p) for p in _gather(kv, f"{prefix}host", size, wait, start_timeout, (host, port))]
                hostnames, everyones_sets = [p[0] for p in posted], [p[1] for p in posted]
                if info.node is not None and comm is None:
                    nodes = [int(n) for n in _gather(kv, f"{prefix}node", size, wait, start_timeout, (host, port))]
                rt.connect(addresses)
            except BaseException as error:
                # Leave nothing behind, so that a later init() starts clean.
                if rt is not None:
                    rt.destroy()
                if server is not None:
                    server.stop()
                _state.kv_server = None
                if isinstance(error, KVStoreError):
                    raise _rendezvous_failure(error, info, host, port) from error
                raise
            finally:
                if kv is not None:
                    kv.close()
        topologies = launch_env.local_topologies(hostnames)
        mine = topologies[rank]
        if info.topology_known and comm is None:
            _state.local_rank, _state.local_size = info.local_rank, info.local_size
            _state.cross_rank, _state.cross_size = info.cross_rank, info.cross_size
            if nodes is not None:
                _state.cross_rank, _state.cross_size = launch_env.cross_of_nodes(nodes, rank)
        else:
            _state.local_rank, _state.local_size = mine.local_rank, mine.local_size
            _state.cross_rank, _state.cross_size = mine.cross_rank, mine.cross_size
        # As the local sizes say: torchrun's nodes count them (agents on one host are nodes of their own).
        sizes = collections.Counter(nodes).values() if nodes is not None else [t.local_size for t in topologies]
        _state.homogeneous = len(set(sizes)) == 1
        _state.runtime, _state.rank, _state.size = rt, rank, size
        _state.listed_members = members is not None
        _state.names = {}
        _state.process_sets = {0: global_process_set}
        global_process_set.ranks = list(range(size))
        global_process_set.mpi_comm = mpi_comm
        try:
            register_static_sets(static_sets, listed, everyones_sets, size, rt.add_process_set, _state.process_sets,
                                 _state.aliases)
        except BaseException:
            shutdown()  # every rank fails here alike; a later init() starts clean
            raise
        if not _state.atexit_registered:
            atexit.register(shutdown)
            _state.atexit_registered = True
        _note_exits_for_launcher()


_LAUNCHER_NAMES_LATE_RANKS_S = 5.0

def _report_arrival(kv, info, members, generation):
    """Tells the launcher's start watch (runner/job.py) that this rank reached init; under
    init(comm=[ranks]) first which ranks form its job, so that the watch waits for no rank that no
    such job lists (one left out may have ended already when the first member comes). Also which
    ranks this rank's init named, for the members that wait for it (_same_job_or_raise)."""
    if members is not None:
        kv.set(f"members/{members[0]}", ",".join(map(str, members)).encode())
    kv.set(f"init{generation}/job/{info.rank}", _job_text(members).encode())
    kv.set(f"ready/{info.rank}", b"1")


def _job_text(members):
    return "init()" if members is None else f"init(comm={members})"


def _same_job_or_raise(kv, info, members, generation, index):
    """Raises at once when the member at index of this rank's job, which this rank waits for, has
    called init with another list of ranks: it will never join this job (it may be training in a
    job of its own), and the wait would end only at the start timeout, blaming that rank's start.

    Raises:
        HoroInvalidArgument: naming both calls.
    """
    peer = members[index] if members is not None else index
    try:
        theirs = kv.get(f"init{generation}/job/{peer}", timeout=0).decode()
    except KVTimeoutError:
        return  # not in init yet
    if theirs != _job_text(members):
        raise HoroInvalidArgument(f"rank {peer} called {theirs} while rank {info.rank} called {_job_text(members)}: "
                                  "every rank of a job must pass the same list of ranks")


def _rendezvous_failure(error, info, host, port):
    """The Horo error for a failure of the rendezvous (a horo_core.kv_wire error), naming who hosts
    it: under a launcher other than hororun that is rank 0, whose death closes it mid-init."""
    who = "hororun's rendezvous" if info.family == "hororun" else "the rendezvous that rank 0 hosts"
    text = f"init: {who} at {host}:{port} failed: {error}"
    if isinstance(error, KVAuthError):
        return HoroAuthError(text + " (every rank needs the same HORO_SECRET)")
    if isinstance(error, KVTimeoutError):
        return HoroTimeoutError(text)
    if isinstance(error, KVConnectionError) and info.family != "hororun":
        text += "; is rank 0 still running?"
    return HoroPeerLostError(text)


def _gather(kv, prefix, size, wait, start_timeout, rendezvous, check=None):
    """Every rank's value under prefix/<rank> in the rendezvous, each waited for up to wait s;
    check(rank), if given, runs every _CHECK_WHILE_WAITING_S of a wait and may raise.

    Raises:
        HoroTimeoutError: a rank did not post its value in time (it never started, or started late).
    """
    values = []
    for r in range(size):
        deadline = time.monotonic() + wait
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                values.append(kv.get(f"{prefix}/{r}", timeout=left if check is None else
                                     min(left, _CHECK_WHILE_WAITING_S)).decode())
                break
            except KVTimeoutError:
                if check is not None:
                    check(r)
                if time.monotonic() >= deadline:
                    raise HoroTimeoutError(
                        f"rank {r} did not reach the rendezvous at {rendezvous[0]}:{rendezvous[1]} within "
                        f"{start_timeout:g} s (the start timeout: raise HORO_START_TIMEOUT or hororun "
                        "--start-timeout if ranks start slowly)") from None
    return values


_CHECK_WHILE_WAITING_S = 0.5


def _note_exits_for_launcher():
    """Under hororun, an exception that ends this process is noted for the launcher, which names
    the rank whose failure ended the job rather than a rank that failed because of it (whose
    collective raised HoroShutdownError or HoroPeerLostError when that rank exited, and which may
    exit first). See horo_runner.local_exec."""
    if not os.environ.get("HORO_EXIT_NOTES") or getattr(sys.excepthook, "horo_notes_exits", False):
        return
    previous = sys.excepthook

    def note_and_report(exc_type, exc, tb):
        note_exit_for_launcher(exc)
        previous(exc_type, exc, tb)

    note_and_report.horo_notes_exits = True
    sys.excepthook = note_and_report


def note_exit_for_launcher(exc):
    """Notes for hororun that this rank is exiting on exc: the job's stall shutdown (``stalled``
    and the ranks it waited for), a ``consequence`` of another rank ending the job, or its
    ``cause`` (horo_runner.run's workers call it for the exception they catch)."""
    directory, rank = os.environ.get("HORO_EXIT_NOTES"), os.environ.get("HORO_RANK")
    if not directory or not rank:
        return
    stalled = _stalled_ranks(exc)
    try:
        with open(os.path.join(directory, rank), "w") as f:
            if stalled:
                f.write("stalled " + " ".join(map(str, stalled)))
            else:
                f.write("consequence" if _ended_by_another_rank(exc) else "cause")
    except OSError:
        pass


def _stalled_ranks(exc):
    """The ranks that the stall shutdown behind exc waited for (its message lists them, as the
    core's stall inspector writes it: "Missing ranks: rank 1: [...]; rank 2: [...]"); [] when exc
    is not that shutdown."""
    message = str(exc) if isinstance(exc, HoroShutdownError) else ""
    found = re.search(r"shutting down after tensors stalled for .*?Missing ranks: (rank \d+: \[.*)$", message)
    return sorted({int(r) for r in re.findall(r"(?:^|; )rank (\d+): \[", found.group(1))}) if found else []


def _ended_by_another_rank(exc):
    """Whether exc, or an exception it was raised from or while handling, is a collective's
    failure because another rank shut down or was lost (not this rank's own shutdown())."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, (HoroShutdownError, HoroPeerLostError)) and "shutdown() was called" not in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


# Called by shutdown() with the runtime, once it has failed what had not completed and before it
# is freed (see at_shutdown).
_shutdown_hooks = []


def at_shutdown(hook):
    """Has every shutdown() call hook(runtime) while the runtime's handles are all complete and
    still readable: a framework adapter settles its handles there, so that synchronize() after
    shutdown() returns a completed operation's result (or raises its error), as in Horovod. An
    exception from a hook is logged; the shutdown goes on."""
    if hook not in _shutdown_hooks:
        _shutdown_hooks.append(hook)


def _run_shutdown_hooks(rt):
    for hook in list(_shutdown_hooks):
        try:
            hook(rt)
        except Exception:  # noqa: BLE001 - a hook must not stop the shutdown; its traceback is shown
            logging.getLogger("horo").exception("Horo: a shutdown hook (%r) failed", hook)


def shutdown():
    """Shuts Horo down on this process: outstanding operations fail, every rank is told."""
    with _state.lock:
        rt, _state.runtime = _state.runtime, None
        _state.closing = rt
        try:
            if rt is not None:
                rt.destroy(settle=lambda: _run_shutdown_hooks(rt))
        finally:
            _state.closing = None
            for ps in list(_state.process_sets.values()) + _state.aliases:
                if ps is not global_process_set:
                    ps.process_set_id = None
            _state.process_sets, _state.aliases = {}, []
            if _state.kv_server is not None:
                _state.kv_server.stop()
                _state.kv_server = None
            if _state.hub is not None:
                _state.hub.close()
                _state.hub = None


def is_initialized():
    """True between init() and shutdown()."""
    return _state.runtime is not None


def start_timeline(file_path, mark_cycles=False):
    """Starts recording the timeline: a Chrome trace JSON file that rank 0 writes at file_path with
    the negotiation and execution of every tensor on every rank (open it in ui.perfetto.dev).

    Call it on every rank, like Horovod; the other ranks ignore file_path and send their events to
    rank 0. Starting again with the same path goes on writing that file; another path closes it
    and starts the new one.

    Args:
        file_path: the file rank 0 creates (or truncates).
        mark_cycles: also mark the start of every negotiation round (CYCLE_START).
    Raises:
        ValueError: Horo is not initialized; HORO_TIMELINE (or HOROVOD_TIMELINE) was not set, to a
            path or DYNAMIC, before init(), as Horovod requires; or rank 0 cannot create file_path.
    """
    runtime().start_timeline(file_path, mark_cycles)


def stop_timeline():
    """Stops recording the timeline. Call it on every rank: on rank 0 it returns once the file is
    closed (a complete JSON array with every rank's events); stopping when no timeline is being
    recorded does nothing.

    Raises:
        ValueError: Horo is not initialized.
    """
    runtime().stop_timeline()


def runtime():
    """The core runtime of this process. Raises ValueError before init()."""
    rt = _state.runtime
    if rt is None:
        raise HoroNotInitializedError(NOT_INITIALIZED)
    return rt


def _topology(value):
    runtime()
    return value


def size():
    """Number of ranks in the job."""
    return _topology(_state.size)


def rank():
    """This process's global rank."""
    return _topology(_state.rank)


def local_size():
    """Number of ranks on this host."""
    return _topology(_state.local_size)


def local_rank():
    """This process's rank among the ranks of its host."""
    return _topology(_state.local_rank)


def cross_size():
    """Number of hosts that have a rank with this process's local rank."""
    return _topology(_state.cross_size)


def cross_rank():
    """Index of this host among the hosts that have a rank with this process's local rank."""
    return _topology(_state.cross_rank)


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    return _topology(_state.homogeneous)


def process_set_registered(process_set_id):
    """Whether process_set_id names a process set registered now (under init, or since)."""
    with _state.lock:
        return process_set_id in _state.process_sets


def auto_name(kind, process_set_id):
    """Names an unnamed operation by call order: the n-th unnamed allreduce on a process set is
    "allreduce.noname.<n>" on every rank, so ranks must issue unnamed operations in the same order."""
    with _state.lock:
        key = (kind, process_set_id)
        n = _state.names.get(key, 0)
        _state.names[key] = n + 1
    return f"{kind}.noname.{n}"


def member_names(base, count, group=None):
    """The core names of the count tensors of one call named base: base itself for one tensor,
    ``base.0`` ... for a group. A group call of one tensor (group: by default whether the kind starts
    with "grouped_") is a group too, so that ranks whose group calls differ in size meet at
    ``base.0`` and get a mismatch error, instead of waiting for names the others never submit."""
    if count == 1 and not (base.startswith("grouped_") if group is None else group):
        return [base]
    return [f"{base}.{i}" for i in range(count)]


def is_auto_name(name):
    """Whether name is one auto_name made (a new one for every unnamed call)."""
    return ".noname." in name


def require_dynamic_process_sets(what):
    runtime()
    if not _state.dynamic:
        raise HoroInvalidArgument(f"{what} needs dynamic process sets: call hvd.init(process_sets='dynamic') or "
                                  "set HORO_DYNAMIC_PROCESS_SETS=1")


def job_has_no_communicator():
    """Whether init(comm=[ranks]) made the job, so that no MPI communicator numbers its ranks."""
    return _state.listed_members


def register_process_set(ps):
    ps.process_set_id = runtime().add_process_set(ps.ranks)
    _state.process_sets[ps.process_set_id] = ps


def forget_process_set(ps):
    _state.process_sets.pop(ps.process_set_id, None)


# Capability queries: what this build of Horo uses (it has its own TCP and shared-memory data paths).

def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    """Version code of the NCCL that CUDA collectives use (e.g. 22907 for 2.29.7), 0 when no NCCL
    library loads (Horovod returns an int here). NCCL is found at run time, see horo_core.nccl."""
    from horo_core import nccl
    return nccl.version()


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """Whether CUDA tensors are supported: the core loads the CUDA driver (libcuda.so.1) at run
    time, so this is whether that driver is present, not a build option."""
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def rocm_built():
    return False


def gpu_available(ext_base_name, verbose=False):
    """Whether the framework sees a GPU (Horovod's ``horovod.common.util.gpu_available``, which its
    scripts and tests call as ``hvd.gpu_available('tensorflow')`` or ``('torch')``).

    Args:
        ext_base_name: ``"tensorflow"`` or ``"torch"``; another framework has no GPU support here.
        verbose: print the answer, as Horovod does.
    """
    available = False
    if ext_base_name == "tensorflow":
        import tensorflow as tf
        available = bool(tf.config.list_physical_devices("GPU"))
    elif ext_base_name == "torch":
        import torch
        available = torch.cuda.is_available()
    if verbose:
        print(f"Extension {ext_base_name} {'was' if available else 'was NOT'} built with GPU support.")
    return available


def sycl_built():
    """Intel GPUs (Horovod's SYCL/oneCCL build): not supported."""
    return False


def tcp_built():
    """Horo's own TCP transport is always built."""
    return True
