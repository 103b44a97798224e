"""Forwards workers' output line by line with Horovod's ``[<rank>]<stdout>:`` prefix.

Each worker pipe has a reader thread. It cuts the byte stream at ``\\n``, ``\\r\\n`` and a lone
``\\r`` (so progress bars that redraw a line with ``\\r`` still show up), keeps each terminator, and
hands whole lines to one shared :class:`OutputSink`, which writes every line with a single locked
write: lines from different ranks never interleave mid-line. A last line without a terminator is
flushed, with a ``\\n`` added, when the pipe closes. With ``--output-filename`` the same lines are
also written to ``<dir>/rank.<rank>/{stdout,stderr}`` (zero-padded rank, as Horovod does).
"""
from __future__ import annotations

import os
import threading
import time
from typing import IO, Optional

__all__ = ["OutputSink", "forward_pipe", "split_lines", "rank_dir_name"]

_READ_CHUNK = 65536


def rank_dir_name(rank: int, size: int) -> str:
    """``rank.<rank>`` zero-padded to the width of ``size - 1`` (Horovod's layout)."""
    return f"rank.{str(rank).zfill(len(str(max(size - 1, 0))))}"


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """Cuts ``pending + chunk`` into complete lines and a remainder.

    A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r``; the terminator stays on the line. A
    trailing ``\\r`` is kept in the remainder because the next chunk may start with ``\\n``.

    Args:
        pending: the remainder returned by the previous call.
        chunk: newly read bytes.

    Returns:
        ``(lines, remainder)``.
    """
    data = pending + chunk
    lines = []
    start = 0
    i = 0
    n = len(data)
    while i < n:
        byte = data[i]
        if byte == 0x0A:  # \n
            lines.append(data[start:i + 1])
            start = i + 1
        elif byte == 0x0D:  # \r
            if i + 1 == n:
                break  # maybe the first half of \r\n: decide with the next chunk
            end = i + 2 if data[i + 1] == 0x0A else i + 1
            lines.append(data[start:end])
            start = end
            i = end - 1
        i += 1
    return lines, data[start:]


class OutputSink:
    """Writes prefixed worker lines to the launcher's streams and optional per-rank files.

    Args:
        stdout: text stream for workers' stdout lines.
        stderr: text stream for workers' stderr lines.
        size: number of ranks (for the zero padding of per-rank directories).
        output_dir: if set, also write each rank's lines to ``<dir>/rank.<r>/{stdout,stderr}``.
        prefix_timestamp: precede each prefix with ``time.asctime()``.
    """

    def __init__(self, stdout: IO[str], stderr: IO[str], size: int,
                 output_dir: Optional[str] = None, prefix_timestamp: bool = False):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._prefix_timestamp = prefix_timestamp
        self._lock = threading.Lock()
        self._files: dict[tuple[int, str], IO[str]] = {}
        if output_dir is not None:
            for rank in range(size):
                rank_dir = os.path.join(output_dir, rank_dir_name(rank, size))
                os.makedirs(rank_dir, exist_ok=True)
                for stream in ("stdout", "stderr"):
                    self._files[(rank, stream)] = open(os.path.join(rank_dir, stream), "w",
                                                       encoding="utf-8", newline="")

    def write_lines(self, rank: int, stream: str, lines: list[bytes]) -> None:
        """Writes complete lines of one rank's stream, each with its prefix, atomically.

        Args:
            rank: the worker's rank.
            stream: ``"stdout"`` or ``"stderr"``.
            lines: byte lines, each ending with its terminator.
        """
        if not lines:
            return
        stamp = time.asctime() if self._prefix_timestamp else ""
        prefix = f"{stamp}[{rank}]<{stream}>:"
        text = "".join(prefix + line.decode("utf-8", errors="replace") for line in lines)
        with self._lock:
            out = self._streams[stream]
            if out is not None:
                try:
                    out.write(text)
                    out.flush()
                except BrokenPipeError:
                    # The reader went away (`hororun ... | head`): the job goes on, its lines for
                    # this stream are dropped (the per-rank files still get them).
                    self._streams[stream] = None
                    _silence(out)
            f = self._files.get((rank, stream))
            if f is not None:
                f.write(text)
                f.flush()

    def close(self) -> None:
        """Closes the per-rank files."""
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


def _silence(stream: IO[str]) -> None:
    """Points a stream whose reader has gone at /dev/null, so that its unwritten buffer does not
    raise again when the interpreter flushes it at exit."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def forward_pipe(fd: int, rank: int, stream: str, sink: OutputSink) -> None:
    """Reads a worker pipe until EOF and forwards its lines; closes ``fd``.

    Args:
        fd: the read end of the worker's pipe.
        rank: the worker's rank.
        stream: ``"stdout"`` or ``"stderr"``.
        sink: where lines go.
    """
    pending = b""
    try:
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            lines, pending = split_lines(pending, chunk)
            sink.write_lines(rank, stream, lines)
        if pending:
            if not pending.endswith((b"\n", b"\r")):
                pending += b"\n"
            sink.write_lines(rank, stream, [pending])
    finally:
        os.close(fd)
