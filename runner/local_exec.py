"""Starts the workers of a job on this machine and supervises them until the job ends.

Every worker runs in its own session (process group), with stdout/stderr piped through
:mod:`horo_runner.output`. Rank 0 reads the launcher's stdin, the other ranks an empty one (as
mpirun forwards stdin to rank 0 only), so ``cat prompts.txt | hororun -np 2 python serve.py`` feeds
one rank, not a racing pair. The job ends when every worker has exited 0, or at the first of:

* a worker exits non-zero or is killed by a signal;
* a monitor (e.g. the start-timeout watch) reports a failure;
* the launcher receives SIGINT, SIGTERM or SIGHUP (its terminal or ssh session closed).

SIGUSR1 and SIGUSR2 sent to the launcher are passed on to every running worker (not to what the
workers started), as mpirun does, and the job goes on: Slurm's ``--signal=USR1@<seconds>`` asks a
job to checkpoint before its time limit that way.

A launcher killed outright (SIGKILL, the out-of-memory killer) cannot clean up: on Linux every
worker asks the kernel for SIGKILL when the launcher dies (``PR_SET_PDEATHSIG``), so that no rank
goes on alone holding its CPUs and GPUs, and a watchdog process that the launcher starts first (in
a session of its own) SIGKILLs every worker's process group once the launcher's end of a pipe
closes without a word that the job is over: what the workers started (data loaders, servers)
dies with them, as under Horovod's per-rank middleman. The watchdog then also removes what such
a job leaves on disk: the exit notes, and the shared-memory segments of workers killed while they
set up their links (the launcher removes those itself as each worker exits).

The failing worker the job is blamed on is the first to exit non-zero, unless that worker noted
(horo_core, under ``exit_notes_dir``) that its error came from another rank ending the job (a
collective that failed because a peer shut down or was lost): then the launcher waits a few
seconds for the worker whose failure that was, which may take longer to exit, and names it.

Then every worker still running gets SIGTERM on its whole process group, and SIGKILL after a grace
period (a second Ctrl-C skips the grace period). Processes that a worker left behind in its group
when it exited get the same at the end of the job, so that none goes on alone. The job's exit code
is the failing worker's code, ``128 + signal`` for a worker killed by a signal or for a signal to
the launcher, 1 for a monitor failure and 127 when a worker cannot be started at all.
"""
from __future__ import annotations

import dataclasses
import errno
import glob
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Mapping, Optional, Sequence

from .output import OutputSink, forward_pipe

__all__ = ["Worker", "ExecOptions", "JobResult", "Monitor", "execute", "EXIT_NOTES_ENV"]

Monitor = Callable[[], Optional[str]]
"""Runs in its own thread; returns a failure message to end the job, or None. It must return
(or may be left blocked; its thread is a daemon) once the job is over."""

_READER_JOIN_S = 10.0  # a detached grandchild may hold a pipe open; do not wait on it forever
_LEFTOVER_GRACE_S = 2.0  # a worker's leftover processes: SIGTERM, then SIGKILL after this long
_CAUSE_WAIT_S = 5.0  # how long a failure that a worker blames on another rank waits for that rank
EXIT_NOTES_ENV = "HORO_EXIT_NOTES"
"""Directory where a rank notes why it is exiting on an exception (horo_core.basics): a file named
after its rank holding ``consequence`` (another rank ended the job), ``stalled`` and the ranks
that a stall shutdown waited for, or ``cause``."""

# Where a rank's shared-memory segment lives while ranks set up their links (horo_core's
# transport/shm/segment.h: "/horo-<pid>-<random>"). The rank unlinks it once its peers have mapped
# it; a rank killed before that leaves it, and nothing else would ever remove it.
_SHM_SEGMENTS = "/dev/shm/horo-{pid}-*"


# When the process ``pid`` started (clock ticks since boot, as text), or None where there is no
# such process or no /proc: a pid and its start time name one process, never a later one. Source
# text, because the watchdog runs it too.
_PROCESS_START = """
def _process_start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22; the name (field 2) may hold ")"
    except (OSError, IndexError):
        return None
"""
exec(_PROCESS_START)


# The watchdog: reads one line per worker, "<pid> <start time>" (its pid is its process group:
# each starts a session), or "notes <path>" for the exit notes directory, until "done"; if its input
# ends first, the launcher died without cleaning up: every group gets SIGKILL, and the workers'
# segments and notes (files named by rank) are removed, and the notes directory if nothing else is
# in it. A group whose pid now names a process that started at another time is left alone: that
# worker and all it started are gone (the kernel reuses no pid still naming a group), and the pid
# was given to another job, perhaps another session leader.
_WATCHDOG = _PROCESS_START + """
import glob, os, signal, sys
groups, dirs = [], []
for line in sys.stdin:
    line = line.strip()
    if line == "done":
        sys.exit(0)
    if line.startswith("notes "):
        dirs.append(line[6:])
    else:
        pid, _, start = line.partition(" ")
        groups.append((int(pid), start))
groups = [pid for pid, start in groups if _process_start(pid) in (None, start or None)]
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
for group in groups:
    for path in glob.glob(%r.format(pid=group)):
        try:
            os.unlink(path)
        except OSError:
            pass
for path in dirs:
    try:
        for name in os.listdir(path):
            if name.isdigit():
                os.unlink(os.path.join(path, name))
        os.rmdir(path)
    except OSError:
        pass
""" % _SHM_SEGMENTS
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return prctl


_PRCTL = _load_prctl()  # resolved here: the child between fork and exec only calls it


def _die_with(launcher_pid: int):
    """The function a worker runs between fork and exec: SIGKILL when the launcher's starting
    thread ends (the setting survives exec), at once if the launcher is gone already."""
    def set_up() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher_pid:
            os.kill(os.getpid(), signal.SIGKILL)
    return set_up if _PRCTL is not None else None


@dataclasses.dataclass(frozen=True)
class Worker:
    """One process to start: its rank, argv, complete environment and, if bound, its CPUs."""

    rank: int
    command: Sequence[str]
    env: Mapping[str, str]
    cpus: Optional[frozenset[int]] = None


@dataclasses.dataclass(frozen=True)
class ExecOptions:
    """How to run and supervise the workers.

    Attributes:
        output_dir: also write each rank's output under ``<dir>/rank.<r>/``.
        prefix_timestamp: precede each output prefix with a timestamp.
        shown_ranks: if set, only these ranks' output reaches the launcher's streams; a hidden rank
            that ends the job has the last lines of its stderr shown.
        termination_grace_s: seconds between SIGTERM and SIGKILL.
        cwd: working directory of the workers (default: the launcher's).
        exit_notes_dir: where the workers note why they exit on an exception (``EXIT_NOTES_ENV``;
            the caller passes it in their environment), read to blame the right worker.
        on_exit: called with (rank, exit code) as each worker exits, before the job acts on it.
    """

    output_dir: Optional[str] = None
    prefix_timestamp: bool = False
    shown_ranks: Optional[frozenset[int]] = None
    termination_grace_s: float = 5.0
    cwd: Optional[str] = None
    exit_notes_dir: Optional[str] = None
    on_exit: Optional[Callable[[int, int], None]] = None


@dataclasses.dataclass(frozen=True)
class JobResult:
    """How a job ended.

    Attributes:
        exit_code: 0 on success; see the module docstring otherwise.
        failed_rank: the rank whose failure ended the job, or None.
        message: why the job ended early (no ``hororun:`` prefix), or None on success.
        returncodes: each rank's ``Popen.returncode`` (negative for a signal), None if it was
            never started.
    """

    exit_code: int
    failed_rank: Optional[int]
    message: Optional[str]
    returncodes: tuple[Optional[int], ...]


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _as_a_shell_would(command: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment a shell would run ``command`` with: leading ``NAME=value`` words
    go into the environment (``hororun -np 2 OMP_NUM_THREADS=1 python train.py``), as under
    horovodrun, which runs the command through ``sh -c``."""
    command, env = list(command), dict(env)
    while len(command) > 1 and _ASSIGNMENT.match(command[0]):
        name, _, value = command.pop(0).partition("=")
        env[name] = value
    return command, env


def _popen(command: list[str], env: Mapping[str, str], **kwargs) -> subprocess.Popen:
    """Starts command; an executable text file without a ``#!`` line runs under /bin/sh, as a
    shell runs it (execve refuses it with ENOEXEC; a binary for another machine stays refused)."""
    try:
        return subprocess.Popen(command, env=env, **kwargs)
    except OSError as e:
        if e.errno != errno.ENOEXEC:
            raise
        path = command[0] if "/" in command[0] else shutil.which(command[0], path=env.get("PATH", os.defpath))
        try:
            with open(path or command[0], "rb") as f:
                binary = b"\0" in f.read(256)
        except OSError:
            binary = True
        if binary:
            raise
    return subprocess.Popen(["/bin/sh", path, *command[1:]], env=env, **kwargs)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _plural(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _name_ranks(ranks) -> str:
    """Names ranks as in "rank 1" or "ranks 1, 2"."""
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _describe_exit(rank: int, code: int) -> tuple[int, str]:
    if code < 0:
        return 128 - code, f"rank {rank} was killed by signal {-code} ({_signal_name(-code)})"
    return code, f"rank {rank} exited with code {code}"


class _Job:
    def __init__(self, workers: Sequence[Worker], options: ExecOptions, sink: OutputSink):
        self.workers = sorted(workers, key=lambda w: w.rank)
        self.options = options
        self.sink = sink
        # SimpleQueue.put is reentrant, so the signal handler can post to it safely.
        self.events: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self.procs: dict[int, subprocess.Popen] = {}
        self.starts: dict[int, Optional[str]] = {}  # rank -> _process_start of its worker
        self.watchdog: Optional[subprocess.Popen] = None
        self.running: set[int] = set()
        self.returncodes: dict[int, int] = {}
        self.readers: list[threading.Thread] = []

    def _thread(self, target, *args, name: str) -> threading.Thread:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        return t

    def start(self, worker: Worker) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        # A child inherits the CPUs of the thread that starts it: binding this thread for the
        # moment of the start binds the worker from its first instruction, with no window in
        # which it could start threads of its own on other CPUs.
        own_cpus = os.sched_getaffinity(0) if worker.cpus is not None else None
        try:
            if worker.cpus is not None:
                os.sched_setaffinity(0, worker.cpus)
            command, env = _as_a_shell_would(worker.command, worker.env)
            proc = _popen(command, env=env, stdin=None if worker.rank == 0 else subprocess.DEVNULL,
                          stdout=out_w, stderr=err_w, start_new_session=True, close_fds=True,
                          cwd=self.options.cwd, preexec_fn=_die_with(os.getpid()))
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            if own_cpus is not None:
                os.sched_setaffinity(0, own_cpus)
            os.close(out_w)
            os.close(err_w)
        self.procs[worker.rank] = proc
        self.starts[worker.rank] = _process_start(proc.pid)
        self.running.add(worker.rank)
        self.tell_watchdog(f"{proc.pid} {self.starts[worker.rank] or ''}\n")
        for fd, stream in ((out_r, "stdout"), (err_r, "stderr")):
            self.readers.append(self._thread(forward_pipe, fd, worker.rank, stream, self.sink,
                                             name=f"hororun-{stream}-{worker.rank}"))
        self._thread(self._wait_for, worker.rank, proc, name=f"hororun-wait-{worker.rank}")

    def _wait_for(self, rank: int, proc: subprocess.Popen) -> None:
        """Posts the worker's exit, after removing the shared-memory segments it died holding: while
        it is not reaped its pid cannot name another process's segment."""
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        except (ChildProcessError, OSError, AttributeError):  # no os.waitid: macOS before Python 3.13
            pass
        for path in glob.glob(_SHM_SEGMENTS.format(pid=proc.pid)):
            try:
                os.unlink(path)
            except OSError:
                pass
        code = proc.wait()
        try:
            if self.options.on_exit is not None:
                self.options.on_exit(rank, code)
        finally:  # the job waits for this event whatever the callback does
            self.events.put(("exit", rank, code))

    def start_watchdog(self) -> None:
        """Starts the watchdog of the module docstring; without it (it could not start) the job
        runs as before, its workers still dying with the launcher."""
        try:
            self.watchdog = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHDOG], stdin=subprocess.PIPE,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=True, close_fds=True, text=True)
        except OSError:
            self.watchdog = None
            return
        if self.options.exit_notes_dir is not None:
            self.tell_watchdog(f"notes {self.options.exit_notes_dir}\n")

    def tell_watchdog(self, text: str) -> None:
        if self.watchdog is None:
            return
        try:
            self.watchdog.stdin.write(text)
            self.watchdog.stdin.flush()
        except OSError:  # it died: nothing more to tell it
            self.watchdog = None

    def release_watchdog(self) -> None:
        if self.watchdog is not None:
            self.tell_watchdog("done\n")
            try:
                self.watchdog.stdin.close()
            except OSError:
                pass
            if self.watchdog is not None:
                self.watchdog.wait()

    def end_leftovers(self) -> None:
        """SIGTERM what the exited workers left in their process groups, SIGKILL after a grace
        period (their output pipes close when the last of them is gone)."""
        self.signal_groups(self.procs, signal.SIGTERM)
        deadline = time.monotonic() + _LEFTOVER_GRACE_S
        for reader in self.readers:
            reader.join(max(deadline - time.monotonic(), 0))
        self.signal_groups(self.procs, signal.SIGKILL)

    def watch(self, monitor: Monitor) -> None:
        def run() -> None:
            message = monitor()
            if message:
                self.events.put(("monitor", message))
        self._thread(run, name="hororun-monitor")

    def record(self, event: tuple) -> None:
        if event[0] == "exit":
            _, rank, code = event
            self.running.discard(rank)
            self.returncodes[rank] = code

    def _note(self, rank: int) -> str:
        directory = self.options.exit_notes_dir
        if directory is None:
            return ""
        try:
            with open(os.path.join(directory, str(rank))) as f:
                return f.read().strip()
        except OSError:
            return ""

    def _noted_consequence(self, rank: int) -> bool:
        return self._note(rank) == "consequence"

    def stall_note(self, blamed: int) -> str:
        """When the blamed rank failed in the job's stall shutdown, names the ranks the stalled
        tensors waited for (a rank stopped or stuck outside Horo never fails by itself). "" otherwise."""
        note = self._note(blamed).split()
        if not note or note[0] != "stalled" or len(note) < 2:
            return ""
        return f", in the stall shutdown: the job's tensors waited for {_name_ranks(note[1:])}"

    def blamed_rank(self, first: int) -> int:
        """The rank to blame for the job's end, the first failing worker being first: itself,
        unless it noted that another rank ended the job; then the next worker to fail without that
        note, if one does within _CAUSE_WAIT_S (whose failure that likely was)."""
        if not self._noted_consequence(first):
            return first
        deadline = time.monotonic() + _CAUSE_WAIT_S
        while self.running:
            try:
                event = self.events.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if event[0] == "signal":
                self.events.put(event)  # the caller's terminate() sees it
                break
            self.record(event)
            if event[0] == "exit" and event[2] != 0 and not self._noted_consequence(event[1]):
                return event[1]
        return first

    def ended_early_note(self, blamed: int) -> str:
        """When the blamed rank failed because another rank ended the job and the ranks that ended
        before it all exited with code 0 (a script that finished, or called shutdown(), early),
        names those: they are the cause the user looks for. "" otherwise."""
        if not self._noted_consequence(blamed):
            return ""
        early = sorted(r for r, code in self.returncodes.items() if r != blamed and code == 0)
        if not early or any(code != 0 for r, code in self.returncodes.items() if r != blamed):
            return ""
        return f", after {_name_ranks(early)} had exited with code 0 while the others were running"

    def signal_groups(self, ranks, signum: int, groups: bool = True) -> None:
        """Signals the process groups of the given ranks' workers (with groups False, the workers
        alone), except where the worker's pid now names a later process: then its group is gone and
        the pid another's (as in the watchdog)."""
        for rank in ranks:
            pid = self.procs[rank].pid
            if _process_start(pid) not in (None, self.starts[rank]):
                continue
            try:
                (os.killpg if groups else os.kill)(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def terminate(self) -> None:
        """SIGTERM the running workers' groups, then SIGKILL after the grace period."""
        self.signal_groups(list(self.running), signal.SIGTERM)
        deadline = time.monotonic() + self.options.termination_grace_s
        while self.running:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                event = self.events.get(timeout=remaining)
            except queue.Empty:
                break
            if event[0] == "signal":
                break  # a second Ctrl-C: stop waiting politely
            self.record(event)
        self.signal_groups(list(self.running), signal.SIGKILL)
        while self.running:
            self.record(self.events.get())

    def finish(self) -> None:
        deadline = time.monotonic() + _READER_JOIN_S
        for reader in self.readers:
            reader.join(max(deadline - time.monotonic(), 0))


def execute(workers: Sequence[Worker], options: ExecOptions = ExecOptions(),
            monitors: Sequence[Monitor] = (), stdout: Optional[IO[str]] = None,
            stderr: Optional[IO[str]] = None) -> JobResult:
    """Runs the workers to completion and applies the failure policy of the module docstring.

    SIGINT, SIGTERM and SIGHUP handlers (and SIGUSR1 and SIGUSR2 ones, which pass those on to the
    workers) are installed for the duration when called from the main thread. The workers are
    killed by the kernel if the thread that calls this dies.

    Args:
        workers: the processes to start, one per rank (ranks ``0..n-1``).
        options: output and termination settings.
        monitors: callables run in threads that may end the job with a message.
        stdout: stream for prefixed stdout lines (default ``sys.stdout``).
        stderr: stream for prefixed stderr lines (default ``sys.stderr``).

    Returns:
        A :class:`JobResult`.

    Raises:
        ValueError: if the ranks are not exactly ``0..n-1``.
    """
    ranks = sorted(w.rank for w in workers)
    if ranks != list(range(len(ranks))) or not ranks:
        raise ValueError(f"workers must have ranks 0..n-1, got {ranks}")
    sink = OutputSink(stdout or sys.stdout, stderr or sys.stderr, len(ranks),
                      options.output_dir, options.prefix_timestamp, options.shown_ranks)
    job = _Job(workers, options, sink)
    previous_handlers = {}

    def on_signal(signum, frame):
        job.events.put(("signal", signum))

    def pass_on(signum, frame):  # runs in the main thread, which alone changes job.running
        job.signal_groups(list(job.running), signum, groups=False)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
                continue  # started under nohup: the job is meant to outlive the terminal
            previous_handlers[signum] = signal.signal(signum, on_signal)
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            previous_handlers[signum] = signal.signal(signum, pass_on)
    exit_code, failed_rank, message, interrupted = 0, None, None, False
    job.start_watchdog()
    try:
        for worker in job.workers:
            try:
                job.start(worker)
            except OSError as e:
                exit_code, failed_rank = 127, worker.rank
                message = f"could not start rank {worker.rank} ({_as_a_shell_would(worker.command, {})[0][0]}): {e}"
                break
        else:
            for monitor in monitors:
                job.watch(monitor)
            while job.running:
                event = job.events.get()
                if event[0] == "signal":
                    exit_code, interrupted = 128 + event[1], True
                    message = f"received {_signal_name(event[1])}"
                    break
                job.record(event)
                if event[0] == "exit" and event[2] != 0:
                    failed_rank = job.blamed_rank(event[1])
                    exit_code, message = _describe_exit(failed_rank, job.returncodes[failed_rank])
                    message += job.ended_early_note(failed_rank) or job.stall_note(failed_rank)
                    break
                if event[0] == "monitor":
                    exit_code, message = 1, event[1]
                    break
        if job.running:
            stopping = set(job.running)
            job.terminate()
            # Those that ended by a signal: one that failed along with the first just went unseen.
            stopped = sum(1 for r in stopping if job.returncodes[r] < 0)
            if stopped:
                message += f"; {'terminated' if interrupted else 'terminated the remaining'} {_plural(stopped)}"
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        if job.running:  # an unexpected exception: never leave orphans behind
            job.signal_groups(list(job.running), signal.SIGKILL)
        job.end_leftovers()
        job.release_watchdog()
        job.finish()
        if failed_rank is not None:
            sink.show_hidden_tail(failed_rank)
        sink.close()
    return JobResult(exit_code=exit_code, failed_rank=failed_rank, message=message,
                     returncodes=tuple(job.returncodes.get(r) for r in ranks))
