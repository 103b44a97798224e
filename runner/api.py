"""``horo_runner.run``: run a Python function on every rank and collect the return values."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

from .hosts import parse_hostfile, parse_hosts
from .job import JobSpec, run_job
from .launch import MAX_START_TIMEOUT, number_text, start_timeout_from_env
from .run_task import ERROR_FILE, FN_FILE, RESULT_FILE, SYS_PATH_FILE, dumps, write_atomically

# The worker's entry: the directory holding this package goes at the end of its import path, a
# fallback for an interpreter that cannot import horo_runner otherwise; never ahead of the
# standard library and site-packages, as a PYTHONPATH entry would be.
_TASK_ENTRY = ("import sys; sys.path.append(sys.argv[2]); from horo_runner.run_task import main; "
               "sys.exit(main(sys.argv[1:2]))")

__all__ = ["run"]


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


# horovod.run's arguments that do not apply here (accepted with a warning, as hororun's flags) and
# those of elastic training, which Horo does not have (refused, not to run a different job).
_IGNORED_ARGUMENTS = ("ssh_port", "ssh_identity_file", "disable_cache", "use_gloo", "use_mpi", "mpi_args",
                      "network_interface")
_ELASTIC_ARGUMENTS = ("min_num_proc", "max_num_proc", "min_np", "max_np", "slots", "reset_limit", "cooldown_range")


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
        num_proc: int = 1, hosts: Optional[str] = None, hostfile: Optional[str] = None,
        start_timeout: Optional[float] = None, output_filename: Optional[str] = None,
        verbose: bool = False, prefix_output_with_timestamp: bool = False,
        env: Optional[Mapping[str, str]] = None, executable: Optional[str] = None,
        bind_to: str = "auto", np: Optional[int] = None, **horovod_arguments) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` in ``num_proc`` worker processes, like ``hororun -np N``.

    The function and arguments are serialized with cloudpickle (pickle if it is not installed)
    into a private 0700 temporary directory that the workers read from local disk; return values
    come back the same way. Worker output is forwarded with the ``[<rank>]<stdout>:`` prefix.

    Args:
        fn: the function; it may call ``hvd.init()`` and use collectives.
        args: positional arguments for every rank.
        kwargs: keyword arguments for every rank.
        num_proc: number of processes.
        hosts: ``"host:slots,..."`` as for ``-H`` (this machine only for now).
        hostfile: path of a hostfile, as for ``--hostfile``.
        start_timeout: seconds every rank has to register after the first one did (default, and
            0: ``HORO_START_TIMEOUT`` or ``HOROVOD_START_TIMEOUT``, else 30; the workers get it as
            ``HORO_START_TIMEOUT``).
        output_filename: also write each rank's output under this directory.
        verbose: describe the launch on stderr.
        prefix_output_with_timestamp: precede output prefixes with a timestamp.
        env: extra environment variables for the workers (e.g. ``HORO_CYCLE_TIME``).
        executable: Python interpreter for the workers (default ``sys.executable``).
        bind_to: CPUs of each rank, as for ``--bind-to``: ``auto``, ``core`` or ``none``.
        np: the deprecated name of num_proc (as in ``horovod.run``, a DeprecationWarning; it counts
            only while num_proc is 1).
        horovod_arguments: the rest of ``horovod.run``'s arguments. ``ssh_port``,
            ``ssh_identity_file``, ``disable_cache``, ``use_gloo``, ``use_mpi``, ``mpi_args`` and
            ``network_interface`` do not apply and are ignored with a warning; the elastic ones
            (``min_num_proc``, ``max_num_proc``, their deprecated names ``min_np`` and ``max_np``,
            ``slots``, ``reset_limit``, ``cooldown_range``) are refused unless None.

    Returns:
        Every rank's return value, in rank order.

    Raises:
        RuntimeError: a rank raised (the message names the rank and includes its traceback) or
            the job failed otherwise (a rank crashed, a start timeout, SIGTERM or SIGHUP).
        KeyboardInterrupt: SIGINT (Ctrl-C) reached this process; the workers were terminated.
        ValueError: for invalid hosts, both ``hosts`` and ``hostfile``, both ``use_gloo`` and
            ``use_mpi``, ``bind_to="core"``
            with more ranks than cores, or a start timeout that is not a positive number.
        TypeError: an argument ``horovod.run`` does not have either.
        NotImplementedError: an elastic argument other than None.
    """
    if np is not None:
        # Horovod's words, charged to this module as Horovod's are: Python's default filters show
        # a DeprecationWarning only when charged to __main__, so a script passing np= prints nothing.
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning)
        if num_proc == 1:
            num_proc = np
    if horovod_arguments.get("use_gloo") and horovod_arguments.get("use_mpi"):
        raise ValueError("use_gloo and use_mpi choose different controllers; set at most one")
    for name, value in horovod_arguments.items():
        if name in _ELASTIC_ARGUMENTS:
            if value is not None:
                raise NotImplementedError(f"run(): {name} is for elastic training, which Horo does not "
                                          f"support yet")
        elif name in _IGNORED_ARGUMENTS:
            if value not in (None, False):
                sys.stderr.write(f"hororun: warning: ignoring run({name}=...), which does not apply to Horo\n")
        else:
            raise TypeError(f"run() got an unexpected keyword argument {name!r}")
    if hosts is not None and hostfile is not None:
        raise ValueError("pass either hosts or hostfile, not both")
    if not start_timeout:  # 0 too, as horovod.run reads it: the default
        names = ("HORO_START_TIMEOUT", "HOROVOD_START_TIMEOUT")
        # A start timeout given in env (under either name) stands for the whole job.
        base = {k: v for k, v in os.environ.items() if not (env and any(n in env for n in names) and k in names)}
        start_timeout = start_timeout_from_env({**base, **(env or {})})
    elif not 0 < start_timeout <= MAX_START_TIMEOUT:
        raise ValueError(f"start_timeout must be > 0 and at most {MAX_START_TIMEOUT} seconds, got {start_timeout!r}")
    host_slots = parse_hosts(hosts) if hosts else parse_hostfile(hostfile) if hostfile else None
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = tempfile.mkdtemp(prefix="hororun-")  # mode 0700
    try:
        sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        write_atomically(os.path.join(workdir, SYS_PATH_FILE), json.dumps(sys_path).encode())
        write_atomically(os.path.join(workdir, FN_FILE),
                         dumps((fn, tuple(args), dict(kwargs or {}))))
        spec = JobSpec(
            # -c rather than -m: the package imports run_task itself, and runpy warns when asked to
            # run a module that is already imported.
            command=[executable or sys.executable, "-c", _TASK_ENTRY, workdir, package_parent],
            num_proc=num_proc, hosts=host_slots,
            # The start timeout the launcher waits is the one the workers get, whatever env says.
            settings_env={**(env or {}), "HORO_START_TIMEOUT": number_text(start_timeout)},
            start_timeout=start_timeout, output_dir=output_filename,
            prefix_timestamp=prefix_output_with_timestamp, verbose=verbose, bind_to=bind_to)
        result = run_job(spec)
        if result.exit_code == 128 + signal.SIGINT and result.failed_rank is None:
            # Ctrl-C reached the launcher (the workers are gone): the caller's own KeyboardInterrupt.
            raise KeyboardInterrupt(f"hororun: {result.message}")
        if result.exit_code != 0:
            message = f"hororun: {result.message}"
            if result.failed_rank is not None:
                error = _read_text(os.path.join(workdir,
                                                ERROR_FILE.format(rank=result.failed_rank)))
                if error:
                    message += f"\nrank {result.failed_rank} raised:\n{error}"
            raise RuntimeError(message)
        values = []
        for rank in range(num_proc):
            path = os.path.join(workdir, RESULT_FILE.format(rank=rank))
            try:
                with open(path, "rb") as f:
                    values.append(pickle.load(f))
            except FileNotFoundError:
                raise RuntimeError(f"hororun: rank {rank} exited with code 0 without returning "
                                   f"a result") from None
        return values
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
