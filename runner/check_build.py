"""``hororun --check-build``: what this installation can do, in Horovod's table format.

Frameworks and controllers are checked from this process without importing heavy packages; the
core's own facts come from ``python -m horo_core info`` in a subprocess, so a core that is missing
or fails to load is reported instead of crashing the launcher.
"""
from __future__ import annotations

import subprocess
import sys
from typing import IO

__all__ = ["launcher_version", "check_build"]

_CORE_INFO_TIMEOUT_S = 120


def launcher_version() -> str:
    """``horo_core.__version__`` when the core imports, else ``horo_runner.version``."""
    try:
        from horo_core import __version__ as core_version
        return str(core_version)
    except Exception:  # not built, or a broken build: the launcher still reports its own
        from .version import __version__
        return __version__


def _mark(value: object) -> str:
    return "[X]" if value else "[ ]"


def _core_info() -> tuple[bool, str]:
    try:
        proc = subprocess.run([sys.executable, "-m", "horo_core", "info"], capture_output=True,
                              text=True, timeout=_CORE_INFO_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"could not run python -m horo_core info: {e}"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit code {proc.returncode}"
        return False, f"horo_core is not built or does not load ({reason})"
    return True, proc.stdout.rstrip()


def check_build(out: IO[str]) -> int:
    """Prints the build report.

    Args:
        out: where to print.

    Returns:
        0 (the report itself says what is missing).
    """
    from horo_core import installed_version  # the package's __init__ alone: it needs no build
    torch, tensorflow = installed_version("torch"), installed_version("tensorflow")
    horo_torch, horo_tf = installed_version("horo_torch"), installed_version("horo_tf")
    mpi4py = installed_version("mpi4py")
    core_ok, core_text = _core_info()
    lines = [
        f"Horo v{launcher_version()}:",
        "",
        "Available Frameworks:",
        f"    {_mark(torch)} PyTorch" + (f" {torch}" if torch else "")
        + ("" if not torch else " (horo_torch adapter " + ("found)" if horo_torch else "missing)")),
        f"    {_mark(tensorflow)} TensorFlow" + (f" {tensorflow}" if tensorflow else "")
        + ("" if not tensorflow else " (horo_tf adapter " + ("found)" if horo_tf else "missing)")),
        "",
        "Available Controllers:",
        f"    {_mark(core_ok)} TCP (hororun / torchrun / Slurm rendezvous)",
        f"    {_mark(core_ok and mpi4py)} MPI bootstrap (mpi4py"
        + (f" {mpi4py})" if mpi4py else " not installed)"),
        "",
        "Available Tensor Operations:",
    ]
    if core_ok:
        # The core's own collectives run every operation on CPU tensors, over TCP between ranks.
        lines += [f"    [X] {op}" for op in
                  ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join")]
        nccl = next((line.split(":", 1)[1].strip() for line in core_text.splitlines()
                     if line.strip().startswith("nccl:")), "")
        found = nccl[:1].isdigit()  # a version, else why none loads
        lines += [f"    {_mark(found)} NCCL" + (f" {nccl} (CUDA tensors)" if found else " (no libnccl found)"),
                  "    [ ] Gloo", "    [ ] MPI collectives (MPI is used for bootstrap only)"]
    else:
        lines += ["    none: " + core_text]
    if core_ok:
        lines += ["", "Core (python -m horo_core info):"]
        lines += ["    " + line for line in core_text.splitlines()]
    out.write("\n".join(lines) + "\n")
    out.flush()
    return 0
