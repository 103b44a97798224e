"""Worker side of :func:`horo_runner.run`: load the function, call it, store the outcome.

Invoked as ``python -m horo_runner.run_task <dir>`` where ``<dir>`` is the driver's private (0700)
directory holding ``sys_path.json`` (the driver's import path, so functions pickled by reference
import the same modules) and ``fn.pkl`` (``(fn, args, kwargs)``). On success the return value is
written to ``result.<rank>.pkl``; on an exception its traceback text goes to ``error.<rank>.txt``
and to stderr, and the process exits 1. Files are written under a temporary name and renamed, so
the driver never reads a partial file.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import traceback
from typing import Optional, Sequence

FN_FILE = "fn.pkl"
SYS_PATH_FILE = "sys_path.json"
RESULT_FILE = "result.{rank}.pkl"
ERROR_FILE = "error.{rank}.txt"

try:
    import cloudpickle as _serializer
except ImportError:  # plain pickle still handles functions importable by name
    _serializer = pickle


def dumps(obj: object) -> bytes:
    """Serializes with cloudpickle when installed, else pickle (local files only, never sent)."""
    return _serializer.dumps(obj)


def write_atomically(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the stored function for this rank.

    Args:
        argv: ``[<dir>]``; defaults to ``sys.argv[1:]``.

    Returns:
        The process exit code: 0 on success, 1 if the function raised.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m horo_runner.run_task <dir>\n")
        return 2
    workdir = args[0]
    with open(os.path.join(workdir, SYS_PATH_FILE), encoding="utf-8") as f:
        for entry in json.load(f):
            if entry not in sys.path:
                sys.path.append(entry)
    from horo_core.launch_env import detect

    rank = detect().rank
    try:
        with open(os.path.join(workdir, FN_FILE), "rb") as f:
            fn, fn_args, fn_kwargs = pickle.load(f)
        payload = dumps(fn(*fn_args, **fn_kwargs))
    except Exception as exc:
        from horo_core.basics import note_exit_for_launcher
        note_exit_for_launcher(exc)
        text = traceback.format_exc()
        write_atomically(os.path.join(workdir, ERROR_FILE.format(rank=rank)), text.encode())
        sys.stderr.write(text)
        return 1
    write_atomically(os.path.join(workdir, RESULT_FILE.format(rank=rank)), payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
