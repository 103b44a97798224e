"""Tests of the hororun launcher (runner/, imported as horo_runner): real processes on loopback.

Workers are small ``python -c`` programs that read HORO_RANK. The launcher package lives in the
top-level ``runner/`` folder; for tests it is made importable as ``horo_runner`` through a
symlink in a temporary directory (setup.py does the mapping for installs).
"""
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from hororun_helpers import hororun, hororun_cmd, worker


# ------------------------------------------------------------------------------- failures


def test_failing_rank_terminates_the_others(child_env):
    code = """
        import os, sys, time
        if os.environ["HORO_RANK"] == "1":
            sys.exit(3)
        time.sleep(3600)
    """
    proc = hororun(child_env, "-np", "4", *worker(code))
    assert proc.returncode == 3
    assert "hororun: rank 1 exited with code 3; terminated the remaining 3 ranks\n" in \
        proc.stderr.decode()


def test_only_ranks_ended_by_hororun_count_as_terminated(child_env, tmp_path):
    """Rank 1 fails on its own while hororun handles rank 0's failure: the message said "terminated
    the remaining 1 rank" of a rank that hororun never had to stop."""
    code = f"""
        import os, signal, sys, time
        flag = {str(tmp_path / "ignoring")!r}
        if os.environ["HORO_RANK"] == "1":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open(flag, "w").close()
            time.sleep(1)
            sys.exit(4)
        while not os.path.exists(flag):
            time.sleep(0.01)
        sys.exit(3)
    """
    proc = hororun(child_env, "-np", "2", *worker(code))
    assert proc.returncode == 3
    assert proc.stderr.decode().endswith("hororun: rank 0 exited with code 3\n"), proc.stderr.decode()


# Rank 1 raises; rank 0, waiting in a collective for it, fails with HoroShutdownError when rank 1
# shuts Horo down, and exits first: rank 1 is slow to exit (an atexit handler registered before
# init runs after Horo's shutdown).
RAISES_ON_RANK_ONE = """
    import atexit, os, time
    if os.environ["HORO_RANK"] == "1":
        atexit.register(time.sleep, 2)
    import torch
    import horo_torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm")
    if hvd.rank() == 1:
        raise ValueError("the real failure is on rank 1")
    hvd.allreduce(torch.ones(1), name="never")
"""


def test_the_rank_that_failed_is_named_not_the_one_that_failed_because_of_it(child_env):
    proc = hororun(child_env, "-np", "2", *worker(RAISES_ON_RANK_ONE))
    err = proc.stderr.decode()
    assert "[0]<stderr>:horo_core.errors.HoroShutdownError" in err  # rank 0 did fail, because of rank 1
    assert "[1]<stderr>:ValueError: the real failure is on rank 1" in err
    assert proc.returncode == 1
    assert "hororun: rank 1 exited with code 1\n" in err, err


ENDS_EARLY_ON_RANK_ONE = """
    import os, sys
    import torch
    import horo_torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm")
    if hvd.rank() == 1:
        sys.exit(0)  # a script that ends early: Horo shuts down at exit
    hvd.allreduce(torch.ones(1), name="never")
"""


def test_a_rank_that_ended_early_with_code_0_is_named_beside_the_one_that_failed(child_env):
    proc = hororun(child_env, "-np", "2", *worker(ENDS_EARLY_ON_RANK_ONE))
    err = proc.stderr.decode()
    assert "[0]<stderr>:horo_core.errors.HoroShutdownError" in err
    assert proc.returncode == 1
    assert ("hororun: rank 0 exited with code 1, after rank 1 had exited with code 0 while the others were "
            "running\n") in err, err


SLEEPS_ON_RANK_ONE = """
    import time
    import torch
    import horo_torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm")
    if hvd.rank() == 1:
        time.sleep(600)  # stuck outside Horo: it never fails by itself
    hvd.allreduce(torch.ones(1), name="never")
"""


def test_a_stall_shutdown_names_the_rank_waited_for(child_env):
    proc = hororun(child_env, "--stall-check-warning-time-seconds", "1", "--stall-check-shutdown-time-seconds", "2",
                   "-np", "2", *worker(SLEEPS_ON_RANK_ONE))
    err = proc.stderr.decode()
    assert "Missing ranks: rank 1: [allreduce.never]" in err, err
    assert proc.returncode == 1
    assert ("hororun: rank 0 exited with code 1, in the stall shutdown: the job's tensors waited for rank 1; "
            "terminated the remaining 1 rank\n") in err, err


def test_rank_killed_by_signal(child_env):
    # Killed while its shared-memory segment still had a name (horo_core's transport unlinks it
    # once the peers have mapped it): hororun removes what the rank left in /dev/shm.
    code = """
        import os, signal
        open(f"/dev/shm/horo-{os.getpid()}-left", "w").close()
        print(os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    proc = hororun(child_env, "-np", "1", *worker(code))
    assert proc.returncode == 128 + 9
    assert "hororun: rank 0 was killed by signal 9 (SIGKILL)\n" in proc.stderr.decode()
    pid = int(proc.stdout.decode().split(":")[-1])
    assert not os.path.exists(f"/dev/shm/horo-{pid}-left")


SLEEPING_WORKER = """
    import os, subprocess, time
    helper = subprocess.Popen(["sleep", "3600"])  # as a data loader or a server the rank starts
    print("ready", os.getpid(), helper.pid, flush=True)
    time.sleep(3600)
"""


def start_sleeping_workers(child_env, n):
    """hororun with n workers that sleep, once every worker has said so; returns it and the pids
    of the workers and of the process each of them started."""
    # SIGHUP at its default, whatever this test runs under (hororun keeps nohup's SIG_IGN).
    launcher = subprocess.Popen(hororun_cmd("-np", str(n), *worker(SLEEPING_WORKER)), env=child_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    pids = []
    try:
        while len(pids) < 2 * n:
            line = launcher.stdout.readline().decode()
            assert line, "hororun ended before every worker was ready"
            pids += [int(word) for word in line.split()[-2:]]
    except BaseException:
        launcher.kill()
        launcher.wait()
        raise
    return launcher, pids


def signal_when_ready(proc, signum, ready_lines=1):
    """Reads ready_lines lines ending in "ready" from proc's stdout, sends it signum and returns
    (out, err) once it exits; kills it if it has not exited within a minute."""
    try:
        for _ in range(ready_lines):
            assert proc.stdout.readline().decode().endswith("ready\n")
        proc.send_signal(signum)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def gone(pid):
    """The process has exited (a zombie that its new parent has not reaped yet counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(condition, seconds=30):
    """Polls condition until it holds or seconds have passed (the caller asserts it)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def kill_groups(pids):
    """SIGKILLs the process groups of pids that still exist (what a failed test leaves)."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


CHECKPOINTING_WORKER = """
    import os, signal, subprocess, sys, threading
    got = threading.Event()
    def on_signal(signum, frame):
        print("got", signal.Signals(signum).name, flush=True)
        got.set()
    signal.signal(signal.SIGUSR1, on_signal)
    helper = subprocess.Popen(["sleep", "3600"])  # its default for SIGUSR1 would end it
    print("ready", os.getpid(), helper.pid, flush=True)
    got.wait(120)
    print("helper", "alive" if helper.poll() is None else "gone", flush=True)
    helper.kill()
"""


def test_sigusr1_to_hororun_reaches_every_rank_and_the_job_goes_on(child_env):
    """Slurm's --signal=USR1@N asks a job to checkpoint before its time limit by signalling the
    launcher. hororun died of it (its default action) and the kernel then killed every rank, so no
    handler ran; mpirun passes it on to the ranks. Now hororun does too, and only to the ranks."""
    launcher = subprocess.Popen(hororun_cmd("-np", "2", *worker(CHECKPOINTING_WORKER)), env=child_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        for _ in range(2):
            assert "ready" in launcher.stdout.readline().decode()
        launcher.send_signal(signal.SIGUSR1)
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    for rank in range(2):
        assert f"[{rank}]<stdout>:got SIGUSR1" in lines and f"[{rank}]<stdout>:helper alive" in lines, lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_to_hororun_terminates_workers(child_env, signum):
    # SIGHUP: the terminal or ssh session that ran hororun closed.
    launcher, pids = start_sleeping_workers(child_env, 3)
    try:
        launcher.send_signal(signum)
        _, err = launcher.communicate(timeout=60)
    finally:  # if hororun misbehaves, leave no process of this test behind
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
            kill_groups(pids)
    assert launcher.returncode == 128 + signum
    assert f"hororun: received {signal.Signals(signum).name}; terminated 3 ranks" in err.decode()
    for pid in pids[::2]:  # hororun reaped every worker before exiting
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert all(gone(pid) for pid in pids[1::2])  # and their helpers were terminated with them


def test_hororun_under_nohup_outlives_the_terminal(child_env):
    # nohup hororun ... &: the job is meant to go on when the terminal closes.
    launcher = subprocess.Popen(hororun_cmd("-np", "1", *worker("""
        import time
        print("ready", flush=True)
        time.sleep(1)
        print("done", flush=True)
    """)), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    out, err = signal_when_ready(launcher, signal.SIGHUP)
    assert launcher.returncode == 0 and out.decode().endswith("done\n"), (out, err)


def test_workers_die_with_a_killed_hororun(child_env):
    """hororun killed outright cannot clean up: the kernel kills its workers (PR_SET_PDEATHSIG)
    instead of leaving them running alone, and the watchdog what they started."""
    launcher, pids = start_sleeping_workers(child_env, 2)
    try:
        launcher.kill()
        launcher.wait()
        wait_until(lambda: all(gone(pid) for pid in pids))
        assert all(gone(pid) for pid in pids), [pid for pid in pids if not gone(pid)]
    finally:
        kill_groups(pids)


def test_a_killed_hororun_leaves_nothing_on_disk(child_env):
    """The watchdog removes the launcher's exit notes directory and the shared-memory segments that
    its killed workers left."""
    launcher = subprocess.Popen(hororun_cmd("-np", "2", *worker("""
        import os, time
        open(f"/dev/shm/horo-{os.getpid()}-left", "w").close()
        print("ready", os.getpid(), os.environ["HORO_EXIT_NOTES"], flush=True)
        time.sleep(3600)
    """)), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    pids, left = [], []
    try:
        for _ in range(2):
            _, pid, notes = launcher.stdout.readline().decode().split()[-3:]
            pids.append(int(pid))
            left += [f"/dev/shm/horo-{pid}-left", notes]
        assert all(os.path.exists(path) for path in left)
        launcher.kill()
        launcher.wait()
        wait_until(lambda: not any(os.path.exists(path) for path in left))
        assert not [path for path in left if os.path.exists(path)]
    finally:
        kill_groups(pids)
        for path in left:
            if path.startswith("/dev/shm/") and os.path.exists(path):
                os.unlink(path)


def test_the_watchdog_spares_a_group_whose_pid_was_reused(runner_path):
    """A worker that exited long before the launcher was killed may have had its pid given to
    another job's session leader: the watchdog kills (and sweeps the segments of) only the groups
    whose leader is still the process the launcher started, or gone."""
    from horo_runner.local_exec import _WATCHDOG, _process_start

    sleep = [sys.executable, "-c", "import time; time.sleep(3600)"]
    ours, stranger = (subprocess.Popen(sleep, start_new_session=True) for _ in range(2))
    segments = [f"/dev/shm/horo-{p.pid}-test" for p in (ours, stranger)]
    try:
        for path in segments:
            open(path, "w").close()
        started = int(_process_start(stranger.pid))
        watchdog = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHDOG], stdin=subprocess.PIPE,
                                    text=True)
        # The stranger's pid, as if a worker that started one tick earlier had held it.
        watchdog.communicate(f"{ours.pid} {_process_start(ours.pid)}\n{stranger.pid} {started - 1}\n",
                             timeout=60)
        assert ours.wait(timeout=60) == -signal.SIGKILL and not os.path.exists(segments[0])
        assert stranger.poll() is None and os.path.exists(segments[1])
    finally:
        for proc in (ours, stranger):
            proc.kill()
            proc.wait()
        for path in segments:
            if os.path.exists(path):
                os.unlink(path)


def test_hororun_spares_a_group_whose_pid_was_reused(runner_path):
    """At the end of a job hororun signals what each worker left in its process group, the groups
    of workers reaped long before included: a pid given since to another job's session leader got
    SIGTERM and SIGKILL. Like the watchdog, hororun now signals only groups whose leader is gone or
    still the process it started."""
    from horo_runner.local_exec import ExecOptions, _Job, _process_start

    sleep = [sys.executable, "-c", "import time; time.sleep(3600)"]
    ours, stranger = (subprocess.Popen(sleep, start_new_session=True) for _ in range(2))
    try:
        job = _Job([], ExecOptions(), sink=None)
        job.procs = {0: ours, 1: stranger}
        # The stranger's pid, as if a worker that started one tick earlier had held it.
        job.starts = {0: _process_start(ours.pid), 1: str(int(_process_start(stranger.pid)) - 1)}
        job.signal_groups([0, 1], signal.SIGKILL)
        assert ours.wait(timeout=60) == -signal.SIGKILL
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        for proc in (ours, stranger):
            proc.kill()
            proc.wait()


def test_sigkill_after_grace_period_and_monitor_failure(runner_path):
    """A worker ignoring SIGTERM is killed after the grace period; a monitor ends the job."""
    from horo_runner.local_exec import ExecOptions, Worker, execute

    ready = threading.Event()

    class Stream(io.StringIO):
        def write(self, text):
            n = super().write(text)
            if self.getvalue().count("ignoring") == 2:
                ready.set()
            return n

    code = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring", flush=True)
        time.sleep(3600)
    """
    workers = [Worker(r, worker(code), dict(os.environ)) for r in range(2)]
    out = Stream()
    result = execute(workers, ExecOptions(termination_grace_s=0.2),
                     monitors=[lambda: ready.wait() and "test says stop"], stdout=out,
                     stderr=io.StringIO())
    assert result.exit_code == 1 and result.failed_rank is None
    assert result.message == "test says stop; terminated the remaining 2 ranks"
    assert result.returncodes == (-signal.SIGKILL, -signal.SIGKILL)


def test_commands_run_as_a_shell_runs_them(child_env, tmp_path):
    # horovodrun runs the command through sh -c: leading NAME=value words set variables, and an
    # executable script without a #! line runs under sh. Both failed here with 127.
    script = tmp_path / "no_shebang.sh"
    script.write_text('echo "script $HORO_RANK $1"\n')
    script.chmod(0o755)
    proc = hororun(child_env, "-np", "2", "GREETING=hi", "X=1", *worker("""
        import os
        print(os.environ["GREETING"], os.environ["X"])
    """))
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == ["[0]<stdout>:hi 1", "[1]<stdout>:hi 1"]
    on_path = dict(child_env, PATH=f"{tmp_path}{os.pathsep}{child_env.get('PATH', os.defpath)}")
    for command in (str(script), script.name):  # by its path, and found on PATH
        proc = hororun(on_path, "-np", "2", command, "arg")
        assert proc.returncode == 0, proc.stderr.decode()
        assert sorted(proc.stdout.decode().splitlines()) == ["[0]<stdout>:script 0 arg", "[1]<stdout>:script 1 arg"]
    binary = tmp_path / "other_machine"  # a binary execve refuses is not handed to sh
    binary.write_bytes(b"\x7fELF\x02\x01\x01\0" + bytes(64))
    binary.chmod(0o755)
    proc = hororun(child_env, "-np", "1", str(binary))
    assert proc.returncode == 127 and "Exec format error" in proc.stderr.decode(), proc.stderr.decode()
    proc = hororun(child_env, "-np", "1", "X=1", "/nonexistent/program")
    assert proc.returncode == 127
    assert "hororun: could not start rank 0 (/nonexistent/program)" in proc.stderr.decode()


def test_python_m_launch_runs_without_a_warning(child_env):
    # python -m horo_runner.launch, as python -m horovod.runner.launch: runpy warned on every launch
    # that the package had imported the module already.
    proc = hororun(child_env, "-np", "1", "true")
    assert (proc.returncode, proc.stderr) == (0, b"")


def test_command_not_found(child_env):
    proc = hororun(child_env, "-np", "2", "/nonexistent/program")
    assert proc.returncode == 127
    assert "hororun: could not start rank 0 (/nonexistent/program)" in proc.stderr.decode()


def failed_start(child_env, np, start_timeout, code):
    """hororun's message for a job of np ranks running code that fails to start (exit code 1)."""
    proc = hororun(child_env, "-np", str(np), "--start-timeout", str(start_timeout), *worker(code))
    assert proc.returncode == 1, proc.stderr.decode()
    return proc.stderr.decode()


def test_start_timeout_names_ranks_that_never_registered(child_env):
    code = """
        import os, time
        from horo_core.launch_env import detect
        from horo_core.kvstore import KVClient
        info = detect()
        if info.rank == 0:
            c = KVClient(*info.rendezvous, info.secret)
            c.set("ready/0", b"1")
        time.sleep(3600)
    """
    assert ("hororun: ranks 1, 2 did not register with the rendezvous within 0.5 s of the first "
            "rank (--start-timeout); terminated the remaining 3 ranks") in failed_start(child_env, 3, 0.5, code)


def test_a_rank_that_ended_before_init_fails_the_start_at_once(child_env):
    """Rank 1 exits with code 0 without calling init(): rank 0 waits in init() for a rank that will
    never come, and hororun waited out the whole start timeout before naming it (here 300 s: the
    test's own timeout of 60 s ends it first)."""
    code = """
        import os, sys
        if os.environ["HORO_RANK"] == "1":
            sys.exit(0)
        import horo_core.basics as basics
        basics.init()
    """
    message = failed_start(child_env, 2, 300, code)
    assert ("hororun: rank 1 exited with code 0 before registering with the rendezvous (in init()), while the "
            "others wait there for every rank; terminated the remaining 1 rank") in message


def test_ranks_left_out_of_init_are_not_waited_for(child_env):
    """init(comm=[0]): rank 1 is not a member and never calls init(). hororun's start watch
    waited for it all the same and ended the job once the start timeout had passed. Nor is a rank
    left out that has ended already taken for one that ended before it could register."""
    code = """
        import os, time
        import horo_core.basics as basics
        if os.environ["HORO_RANK"] == "0":
            basics.init(comm=[0])
            print("size", basics.size())
        time.sleep(3)
    """
    proc = hororun(child_env, "-np", "2", "--start-timeout", "0.5", *worker(code))
    assert (proc.returncode, proc.stdout.decode()) == (0, "[0]<stdout>:size 1\n"), proc.stderr.decode()
    code = """
        import os, sys, time
        import horo_core.basics as basics
        rank = int(os.environ["HORO_RANK"])
        if rank == 2:
            sys.exit(0)
        time.sleep(1.0 - rank)  # rank 1 comes first, once rank 2 has ended
        basics.init(comm=[0, 1])
        print("size", basics.size())
    """
    proc = hororun(child_env, "-np", "3", *worker(code))
    assert (proc.returncode, sorted(proc.stdout.decode().splitlines())) == \
        (0, ["[0]<stdout>:size 2", "[1]<stdout>:size 2"]), proc.stderr.decode()


def test_ranks_that_list_different_jobs_fail_at_once(child_env):
    """Rank 0 calls init(comm=[0, 1]), rank 1 init(comm=[1]): rank 1 forms a job of its own, and
    rank 0 waited the whole start timeout for it, then blamed its start. It now fails as soon as
    rank 1's call is known, naming both calls."""
    code = """
        import os, time
        import horo_core.basics as basics
        rank = int(os.environ["HORO_RANK"])
        if rank == 0:
            time.sleep(1)  # rank 1 has made its call
        try:
            basics.init(comm=[0, 1] if rank == 0 else [1])
            print("size", basics.size())
        except ValueError as e:
            print(type(e).__name__, e)
    """
    proc = hororun(child_env, "-np", "2", "--start-timeout", "50", *worker(code))
    assert (proc.returncode, sorted(proc.stdout.decode().splitlines())) == (0, [
        "[0]<stdout>:HoroInvalidArgument rank 1 called init(comm=[1]) while rank 0 called init(comm=[0, 1]): every "
        "rank of a job must pass the same list of ranks",
        "[1]<stdout>:size 1"]), proc.stderr.decode()


def test_start_timeout_names_a_rank_that_reached_init_late(child_env):
    """Rank 1 calls init() long after rank 0: the launcher names it when the start timeout has
    passed since rank 0 came, before rank 0 gives up waiting in init() (with HoroTimeoutError, a
    HorovodInternalError, as run without hororun)."""
    code = """
        import os, time
        if os.environ["HORO_RANK"] == "1":
            time.sleep(60)
        import horo_core.basics as basics
        basics.init()
    """
    assert ("hororun: rank 1 did not register with the rendezvous within 2 s of the first rank (--start-timeout); "
            "terminated the remaining 2 ranks") in failed_start(child_env, 2, 2, code)


# ------------------------------------------------------------------------------- environment


def test_worker_environment_and_rendezvous(child_env):
    code = """
        import json, os
        from horo_core.launch_env import detect
        from horo_core.kvstore import KVClient
        info = detect()
        with KVClient(*info.rendezvous, info.secret) as c:
            c.set(f"ready/{info.rank}", b"1")
            c.set(f"addr/{info.rank}", f"127.0.0.1:{9000 + info.rank}".encode())
            peers = [c.get(f"addr/{r}").decode() for r in range(info.size)]
        names = ["HORO_RANK", "HORO_SIZE", "HORO_LOCAL_RANK", "HORO_LOCAL_SIZE", "HORO_CROSS_RANK",
                 "HORO_CROSS_SIZE", "HORO_HOSTNAME", "HORO_RENDEZVOUS_ADDR", "PYTHONUNBUFFERED",
                 "HORO_START_TIMEOUT", "HORO_FUSION_THRESHOLD", "HORO_CYCLE_TIME",
                 "HORO_CACHE_CAPACITY", "HORO_STALL_CHECK_DISABLE",
                 "HORO_STALL_CHECK_TIME_SECONDS", "HORO_STALL_SHUTDOWN_TIME_SECONDS",
                 "HORO_LOG_LEVEL", "HORO_LOG_HIDE_TIME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                 "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
                 "NCCL_IB_DISABLE"]
        print(json.dumps({"env": {n: os.environ.get(n) for n in names}, "peers": peers,
                          "family": info.family}))
    """
    proc = hororun(child_env, "-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "3.5",
                   "--cache-capacity", "0", "--no-stall-check",
                   "--stall-check-warning-time-seconds", "10",
                   "--stall-check-shutdown-time-seconds", "20", "--log-level", "debug",
                   "--log-without-timestamp", "--start-timeout", "45", "--tcp", *worker(code))
    assert proc.returncode == 0, proc.stderr
    reports = {}
    for line in proc.stdout.decode().splitlines():
        prefix, _, payload = line.partition(":")
        reports[int(prefix[1])] = json.loads(payload)
    for r in range(2):
        assert reports[r]["family"] == "hororun"
        assert reports[r]["peers"] == ["127.0.0.1:9000", "127.0.0.1:9001"]
        assert reports[r]["env"] == {
            "HORO_RANK": str(r), "HORO_SIZE": "2", "HORO_LOCAL_RANK": str(r),
            "HORO_LOCAL_SIZE": "2", "HORO_CROSS_RANK": "0", "HORO_CROSS_SIZE": "1",
            "HORO_HOSTNAME": "localhost", "HORO_RENDEZVOUS_ADDR": "127.0.0.1",
            "PYTHONUNBUFFERED": "1", "HORO_START_TIMEOUT": "45",
            "HORO_FUSION_THRESHOLD": str(32 * 2 ** 20), "HORO_CYCLE_TIME": "3.5",
            "HORO_CACHE_CAPACITY": "0", "HORO_STALL_CHECK_DISABLE": "1",
            "HORO_STALL_CHECK_TIME_SECONDS": "10", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "20",
            "HORO_LOG_LEVEL": "DEBUG", "HORO_LOG_HIDE_TIME": "1",
            # horovodrun's names for the rank facts, for scripts that read them before init()
            "HOROVOD_RANK": str(r), "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": str(r), "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1", "HOROVOD_HOSTNAME": "localhost",
            "NCCL_IB_DISABLE": "1"}


def test_settings_env_only_for_given_flags(runner_path, monkeypatch):
    from horo_runner.launch import parse_args, settings_env
    monkeypatch.delenv("HORO_START_TIMEOUT", raising=False)
    monkeypatch.delenv("HOROVOD_START_TIMEOUT", raising=False)
    assert settings_env(parse_args(["-np", "2", "true"])) == {"HORO_START_TIMEOUT": "30"}
    assert settings_env(parse_args(["-np", "2", "--tcp", "true"]))["NCCL_IB_DISABLE"] == "1"
    env = settings_env(parse_args(["-np", "2", "--fusion-threshold-mb", "0", "true"]))
    assert env["HORO_FUSION_THRESHOLD"] == "0"
    on = settings_env(parse_args(["-np", "2", "--hierarchical-allreduce", "true"]))
    off = settings_env(parse_args(["-np", "2", "--no-hierarchical-allreduce", "true"]))
    assert on["HORO_HIERARCHICAL_ALLREDUCE"] == "1" and off["HORO_HIERARCHICAL_ALLREDUCE"] == "0"
    with pytest.raises(SystemExit):
        parse_args(["-np", "2", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "true"])
    on = settings_env(parse_args(["-np", "2", "--hierarchical-allgather", "true"]))
    off = settings_env(parse_args(["-np", "2", "--no-hierarchical-allgather", "true"]))
    assert on["HORO_HIERARCHICAL_ALLGATHER"] == "1" and off["HORO_HIERARCHICAL_ALLGATHER"] == "0"
    assert "HORO_HIERARCHICAL_ALLREDUCE" not in on and "HORO_HIERARCHICAL_ALLGATHER" not in env
    with pytest.raises(SystemExit):
        parse_args(["-np", "2", "--hierarchical-allgather", "--no-hierarchical-allgather", "true"])
    env = settings_env(parse_args(["-np", "2", "--timeline-filename", "t.json", "--timeline-mark-cycles", "true"]))
    assert env["HORO_TIMELINE"] == "t.json" and env["HORO_TIMELINE_MARK_CYCLES"] == "1"
    # Numbers reach the workers exactly, not rounded to 6 digits.
    env = settings_env(parse_args(["-np", "2", "--start-timeout", "123456.7", "--cycle-time-ms", "0.1234567", "true"]))
    assert (env["HORO_START_TIMEOUT"], env["HORO_CYCLE_TIME"]) == ("123456.7", "0.1234567")


def test_start_timeout_from_horovods_variable_or_ours(runner_path, monkeypatch):
    """horovodrun reads HOROVOD_START_TIMEOUT when --start-timeout is not given; the workers must
    see the same value (the core prefers HORO_START_TIMEOUT, which the launcher sets)."""
    from horo_runner.launch import parse_args, settings_env
    monkeypatch.delenv("HORO_START_TIMEOUT", raising=False)
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "120")
    assert parse_args(["-np", "2", "true"]).start_timeout == 120.0
    assert settings_env(parse_args(["-np", "2", "true"]))["HORO_START_TIMEOUT"] == "120"
    assert parse_args(["-np", "2", "--start-timeout", "7", "true"]).start_timeout == 7.0
    monkeypatch.setenv("HORO_START_TIMEOUT", "45")
    assert parse_args(["-np", "2", "true"]).start_timeout == 45.0
    assert parse_args(["-np", "2", "--start-timeout", "0", "true"]).start_timeout == 45.0  # 0: the default
    for bad in ("abc", "0", "-3", "inf", "nan", "2e6"):
        monkeypatch.setenv("HORO_START_TIMEOUT", bad)
        with pytest.raises(SystemExit):
            parse_args(["-np", "2", "true"])


def _start_timeout_seen():
    import os
    return os.environ.get("HORO_START_TIMEOUT")


def test_run_api_takes_the_start_timeout_from_the_environment_too(runner_path, monkeypatch):
    import horo_runner
    monkeypatch.delenv("HORO_START_TIMEOUT", raising=False)
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "77")
    assert horo_runner.run(_start_timeout_seen, num_proc=1) == ["77"]
    assert horo_runner.run(_start_timeout_seen, num_proc=1, start_timeout=12.5) == ["12.5"]
    assert horo_runner.run(_start_timeout_seen, num_proc=1, start_timeout=0) == ["77"]  # 0: the default, as Horovod's
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="start_timeout must be > 0 and at most 1000000 seconds"):
            horo_runner.run(_start_timeout_seen, num_proc=1, start_timeout=bad)
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HOROVOD_START_TIMEOUT='soon' is not a number of seconds"):
        horo_runner.run(_start_timeout_seen, num_proc=1)
    # env's value is the one the launcher waits and the workers get; an explicit argument wins.
    assert horo_runner.run(_start_timeout_seen, num_proc=1, env={"HORO_START_TIMEOUT": "7"}) == ["7"]
    assert horo_runner.run(_start_timeout_seen, num_proc=1, start_timeout=9, env={"HORO_START_TIMEOUT": "7"}) == ["9"]
    monkeypatch.setenv("HORO_START_TIMEOUT", "55")  # Horovod's name in env still beats ours in the shell
    assert horo_runner.run(_start_timeout_seen, num_proc=1, env={"HOROVOD_START_TIMEOUT": "8"}) == ["8"]


def _python_path_seen():
    return os.environ["PYTHONPATH"].split(os.pathsep)


def test_run_api_takes_horovods_arguments_and_env_pythonpath(runner_path, capfd):
    import horo_runner
    # horovod.run's arguments: those that do not apply are ignored with a warning, as hororun's
    # flags; elastic ones are refused; PYTHONPATH given in env reaches the workers.
    paths = horo_runner.run(_python_path_seen, num_proc=1, use_gloo=True, use_mpi=None, disable_cache=True,
                            ssh_port=22, network_interface="eth0", min_np=None,
                            env={"PYTHONPATH": "/my/lib"})
    # ... as given: the package's own directory is not put ahead of the standard library (a
    # site-packages there would shadow it with backports); the workers append it to sys.path.
    assert paths[0] == ["/my/lib"], paths
    err = capfd.readouterr().err
    for name in ("use_gloo", "disable_cache", "ssh_port", "network_interface"):
        assert f"ignoring run({name}=...)" in err, err
    assert "use_mpi" not in err
    with pytest.raises(NotImplementedError, match="max_np is for elastic training"):
        horo_runner.run(_python_path_seen, num_proc=1, max_np=4)
    with pytest.raises(NotImplementedError, match="min_num_proc is for elastic training"):
        horo_runner.run(_python_path_seen, num_proc=2, min_num_proc=1)
    with pytest.raises(ValueError, match="use_gloo and use_mpi"):
        horo_runner.run(_python_path_seen, num_proc=1, use_gloo=True, use_mpi=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nprocs'"):
        horo_runner.run(_python_path_seen, nprocs=1)


def test_secret_not_in_argv_ps_or_output(child_env, tmp_path):
    secret_file = tmp_path / "secret"
    code = """
        import os, sys
        secret = os.environ["HORO_SECRET"]
        if os.environ["HORO_RANK"] == "0":
            open(sys.argv[1], "w").write(secret)
        leaks = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if secret.encode() in f.read():
                            leaks.append(pid)
                except OSError:
                    pass
        print("argv leaks:", leaks)
    """
    proc = hororun(child_env, "-np", "2", "--verbose", *worker(code), str(secret_file))
    assert proc.returncode == 0, proc.stderr
    secret = secret_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "[0]<stdout>:argv leaks: []" in out and "[1]<stdout>:argv leaks: []" in out
    assert "rendezvous on 127.0.0.1:" in err  # --verbose did describe the launch
    assert secret not in out and secret not in err


def test_each_job_gets_a_fresh_secret(child_env):
    code = "import os, hashlib; print(hashlib.sha256(os.environ['HORO_SECRET'].encode()).hexdigest())"
    digests = [hororun(child_env, "-np", "1", *worker(code)).stdout for _ in range(2)]
    assert digests[0] != digests[1]


# ------------------------------------------------------------------------------- command line


def test_version_and_help(child_env, runner_path):
    from horo_runner.check_build import launcher_version
    proc = hororun(child_env, "--version")
    assert proc.returncode == 0
    assert proc.stdout.decode().strip() == launcher_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", launcher_version())
    help_text = hororun(child_env, "-h").stdout.decode()
    for flag in ("-np", "--num-proc", "-H", "--hosts", "--hostfile", "--output-filename",
                 "--start-timeout", "--fusion-threshold-mb", "--cycle-time-ms",
                 "--cache-capacity", "--no-stall-check", "--stall-check-warning-time-seconds",
                 "--stall-check-shutdown-time-seconds", "--log-level", "--log-without-timestamp",
                 "-prefix-timestamp", "--prefix-output-with-timestamp", "--verbose",
                 "-cb", "--check-build", "-v", "--version", "--gloo", "--network-interfaces",
                 "--hierarchical-allreduce", "--no-hierarchical-allreduce",
                 "--hierarchical-allgather", "--no-hierarchical-allgather",
                 "--timeline-filename", "--timeline-mark-cycles", "--tcp", "--rank-filter"):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}([\s,\]]|$)", help_text), flag


def test_check_build_reports_without_crashing(child_env):
    proc = hororun(child_env, "--check-build")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    for heading in ("Available Frameworks:", "Available Controllers:",
                    "Available Tensor Operations:"):
        assert heading in out
    assert re.search(r"\[[X ]\] PyTorch", out) and re.search(r"\[[X ]\] TensorFlow", out)
    # The versions come from the installed distributions (tensorflow-cpu's for tensorflow): importing
    # the frameworks made the report take 14 s.
    import torch
    assert f"[X] PyTorch {torch.__version__} (horo_torch adapter found)" in out, out
    assert f"\n      torch: {torch.__version__}\n" in out, out
    if importlib.util.find_spec("tensorflow") is not None:
        assert re.search(r"\[X\] TensorFlow \d+\.\d+", out) and re.search(r"\n      tensorflow: \d+\.\d+", out), out


def test_ignored_and_refused_horovod_flags(child_env):
    proc = hororun(child_env, "-np", "1", "--gloo", "--network-interfaces", "eth0",
                   *worker("print('ran')"))
    assert proc.returncode == 0
    err = proc.stderr.decode()
    assert "warning: ignoring --gloo" in err and "warning: ignoring --network-interfaces" in err
    assert proc.stdout.decode() == "[0]<stdout>:ran\n"
    refused = hororun(child_env, "-np", "1", "--host-discovery-script", "x.sh", "true")
    assert refused.returncode == 2
    assert "--host-discovery-script is for elastic training, which Horo does not implement" in refused.stderr.decode()
    refused = hororun(child_env, "-np", "1", "--min-np", "1", "true")
    assert refused.returncode == 2
    assert "--min-np/--min-num-proc is for elastic training" in refused.stderr.decode()


def test_controller_flags_exclude_each_other(child_env):
    """horovodrun takes one of --gloo, --mpi and --jsrun; hororun ignores each alone but refuses
    a pair, as a job script that asks for both has a mistake in it."""
    proc = hororun(child_env, "-np", "1", "--gloo", "--mpi", "true")
    assert proc.returncode == 2
    assert "--gloo and --mpi choose different controllers" in proc.stderr.decode()


def test_stdin_reaches_rank_0_only(child_env):
    """As mpirun: rank 0 reads what is piped into the launcher, the other ranks an empty stdin."""
    code = """
        import os, sys
        print(os.environ["HORO_RANK"], repr(sys.stdin.read()))
    """
    proc = subprocess.run(hororun_cmd("-np", "2", *worker(code)), env=child_env, input=b"two\nlines\n",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert "[0]<stdout>:0 'two\\nlines\\n'\n" in out and "[1]<stdout>:1 ''\n" in out, out


def test_what_a_finished_rank_left_running_ends_with_the_job(child_env):
    """A rank that exits 0 with a process of its own still running: the job ends, and so does
    that process, instead of going on alone."""
    proc = hororun(child_env, "-np", "2", *worker("""
        import subprocess
        print("helper", subprocess.Popen(["sleep", "3600"]).pid, flush=True)
    """))
    assert proc.returncode == 0, proc.stderr
    helpers = [int(line.rsplit(" ", 1)[1]) for line in proc.stdout.decode().splitlines()]
    assert len(helpers) == 2
    deadline = time.monotonic() + 30
    while not all(gone(pid) for pid in helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(pid) for pid in helpers)


@pytest.mark.parametrize("args, message", [
    (["true"], "-np/--num-proc is required"),
    (["-np", "2"], "no command given"),
    (["-np", "1", "--cache-capacity", "-5", "true"], "must be >= 0, got -5"),
    # Values the workers would refuse at init() are refused before any rank starts.
    (["-np", "1", "--cycle-time-ms", "2e6", "true"], "--cycle-time-ms: must be at most 1000000, got 2e6"),
    (["-np", "1", "--stall-check-warning-time-seconds", "2000000", "true"], "must be at most 1000000, got 2000000"),
    (["-np", "1", "--fusion-threshold-mb", "1e13", "true"], "must be at most 8796093022207, got 1e13"),
    (["-np", "2", "-H", "otherhost:2", "true"], "remote hosts are not supported yet: otherhost"),
    (["-np", "3", "-H", "localhost:2", "true"], "requested 3 processes but the hosts provide "
                                                 "only 2 slots"),
])
def test_usage_errors(child_env, args, message):
    proc = hororun(child_env, *args)
    assert proc.returncode == 2
    assert message in proc.stderr.decode()


# ------------------------------------------------------------------------------- run() API


def rank_times(factor):
    from horo_core.launch_env import detect
    info = detect()
    return {"rank": info.rank, "size": info.size, "value": info.rank * factor}


def fail_on_rank_one():
    from horo_core.launch_env import detect
    if detect().rank == 1:
        raise ValueError("boom from rank 1")
    return "fine"


def test_run_returns_results_in_rank_order(runner_path):
    import horo_runner
    results = horo_runner.run(rank_times, args=(10,), num_proc=3)
    assert results == [{"rank": r, "size": 3, "value": 10 * r} for r in range(3)]
    # np, horovod.run's deprecated name of num_proc, still counts, with Horovod's warning, charged to
    # the runner as Horovod's is (so that the default filters keep it out of a script's output).
    with pytest.warns(DeprecationWarning, match="np is deprecated, use num_proc instead") as caught:
        assert [r["rank"] for r in horo_runner.run(rank_times, args=(1,), np=2)] == [0, 1]
    assert caught[0].filename.endswith("api.py"), caught[0].filename
    offset = 7  # a closure is shipped by value
    assert horo_runner.run(lambda x: x + offset, kwargs={"x": 1}, num_proc=2) == [8, 8]


def test_ctrl_c_during_run_is_a_keyboard_interrupt(child_env):
    """Ctrl-C while horo_runner.run waits: the workers are terminated and the caller gets a
    KeyboardInterrupt, which its own handler catches, not a RuntimeError."""
    caller = subprocess.Popen(worker("""
        import time
        import horo_runner

        def sleeper():
            print("ready", flush=True)
            time.sleep(3600)

        try:
            horo_runner.run(sleeper, num_proc=2)
        except KeyboardInterrupt as e:
            print("interrupted:", e, flush=True)
    """), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, err = signal_when_ready(caller, signal.SIGINT, ready_lines=2)
    assert caller.returncode == 0, err.decode()
    assert "interrupted: hororun: received SIGINT; terminated 2 ranks" in out.decode()


def raise_on_rank_one_while_rank_zero_waits():
    import textwrap
    exec(textwrap.dedent(RAISES_ON_RANK_ONE), {})


def test_run_raises_the_traceback_of_the_rank_that_failed_first(runner_path):
    """As test_the_rank_that_failed_is_named_not_the_one_that_failed_because_of_it, through
    horo_runner.run: the error holds rank 1's traceback, not rank 0's HoroShutdownError."""
    import horo_runner
    with pytest.raises(RuntimeError) as info:
        horo_runner.run(raise_on_rank_one_while_rank_zero_waits, num_proc=2)
    message = str(info.value)
    assert "rank 1 exited with code 1" in message
    assert "ValueError: the real failure is on rank 1" in message


def test_run_propagates_an_exception_with_its_traceback(runner_path):
    import horo_runner
    with pytest.raises(RuntimeError) as info:
        horo_runner.run(fail_on_rank_one, num_proc=2)
    message = str(info.value)
    assert "rank 1 exited with code 1" in message
    assert "Traceback (most recent call last)" in message
    assert "ValueError: boom from rank 1" in message
