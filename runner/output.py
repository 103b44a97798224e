"""Forwards workers' output line by line with Horovod's ``[<rank>]<stdout>:`` prefix.

Each worker pipe has a reader thread. It cuts the byte stream at ``\\n``, ``\\r\\n`` and a lone
``\\r`` (so progress bars that redraw a line with ``\\r`` still show up), keeps each terminator, and
hands whole lines to one shared :class:`OutputSink`, which writes every line with a single locked
write: lines from different ranks never interleave mid-line. A last line without a terminator is
flushed, with a ``\\n`` added, when the pipe closes. With ``--output-filename`` the same lines are
also written to ``<dir>/rank.<rank>/{stdout,stderr}`` (zero-padded rank, as Horovod does).
``--rank-filter`` keeps the other ranks' lines off the launcher's streams (not out of the files);
the sink keeps the last lines of their stderr, so that a hidden rank's error can still be shown.
"""
from __future__ import annotations

import collections
import os
import re
import sys
import threading
import time
from typing import IO, Optional

__all__ = ["OutputSink", "forward_pipe", "split_lines", "rank_dir_name"]

_READ_CHUNK = 65536
_HIDDEN_TAIL_LINES = 40  # of a rank that --rank-filter hides: enough for a Python traceback


def rank_dir_name(rank: int, size: int) -> str:
    """``rank.<rank>`` zero-padded to the width of ``size - 1`` (Horovod's layout)."""
    return f"rank.{str(rank).zfill(len(str(max(size - 1, 0))))}"


_LINE_END = re.compile(rb"\r\n|\r|\n")


def split_lines(pending: bytearray, chunk: bytes) -> tuple[list[bytes], bytearray]:
    """Cuts ``pending + chunk`` into complete lines and a remainder.

    A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r``; the terminator stays on the line. A
    trailing ``\\r`` is kept in the remainder because the next chunk may start with ``\\n``. Only
    ``chunk`` is scanned, and a remainder that grows is extended in place, so a line of any length
    costs time in proportion to its length.

    Args:
        pending: the remainder returned by the previous call (bytes are copied; a bytearray is
            reused).
        chunk: newly read bytes.

    Returns:
        ``(lines, remainder)``.
    """
    head = pending if isinstance(pending, bytearray) else bytearray(pending)
    lines = []
    if head.endswith(b"\r") and chunk:  # its line ends here, with the \n that may begin chunk
        cut = 1 if chunk.startswith(b"\n") else 0
        lines.append(bytes(head) + chunk[:cut])
        head, chunk = bytearray(), chunk[cut:]
    start = 0
    for end in _LINE_END.finditer(chunk):
        if end.end() == len(chunk) and end.group() == b"\r":
            break  # maybe the first half of \r\n: decide with the next chunk
        lines.append(bytes(head) + chunk[start:end.end()] if head else chunk[start:end.end()])
        head, start = bytearray(), end.end()
    head += chunk[start:]
    return lines, head


class OutputSink:
    """Writes prefixed worker lines to the launcher's streams and optional per-rank files.

    Args:
        stdout: text stream for workers' stdout lines.
        stderr: text stream for workers' stderr lines.
        size: number of ranks (for the zero padding of per-rank directories).
        output_dir: if set, also write each rank's lines to ``<dir>/rank.<r>/{stdout,stderr}``.
        prefix_timestamp: precede each prefix with ``time.asctime()``.
        shown_ranks: if set, only these ranks' lines go to stdout and stderr (every rank's still go
            to the files).
    """

    def __init__(self, stdout: IO[str], stderr: IO[str], size: int,
                 output_dir: Optional[str] = None, prefix_timestamp: bool = False,
                 shown_ranks: Optional[frozenset[int]] = None):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._prefix_timestamp = prefix_timestamp
        self._shown_ranks = shown_ranks
        self._hidden_tails: dict[int, collections.deque[bytes]] = {}
        self._lock = threading.Lock()
        self._files: dict[tuple[int, str], IO[bytes]] = {}
        if output_dir is not None:
            for rank in range(size):
                rank_dir = os.path.join(output_dir, rank_dir_name(rank, size))
                os.makedirs(rank_dir, exist_ok=True)
                for stream in ("stdout", "stderr"):
                    self._files[(rank, stream)] = open(os.path.join(rank_dir, stream), "wb")

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
        prefix = f"{stamp}[{rank}]<{stream}>:".encode()
        data = b"".join(prefix + line for line in lines)
        with self._lock:
            out = self._streams[stream]
            if self._shown_ranks is not None and rank not in self._shown_ranks:
                out = None
                if stream == "stderr":
                    tail = self._hidden_tails.setdefault(rank, collections.deque(maxlen=_HIDDEN_TAIL_LINES))
                    tail.extend(prefix + line for line in lines)
            if out is not None:
                try:
                    _write(out, data)
                except BrokenPipeError:
                    # The reader went away (`hororun ... | head`): the job goes on, its lines for
                    # this stream are dropped (the per-rank files still get them).
                    self._streams[stream] = None
                    _silence(out)
                except (OSError, ValueError) as e:  # a full disk, a closed stream
                    self._streams[stream] = None
                    self._tell(f"hororun: cannot write the ranks' {stream} ({e}); "
                               f"their {stream} lines are dropped from now on")
            f = self._files.get((rank, stream))
            if f is not None:
                try:
                    f.write(data)
                    f.flush()
                except (OSError, ValueError) as e:
                    del self._files[(rank, stream)]
                    self._tell(f"hororun: cannot write {f.name} ({e}); rank {rank}'s {stream} lines "
                               f"are no longer written there")

    def show_hidden_tail(self, rank: int) -> None:
        """Writes the last stderr lines of a rank that the filter hid (the one that failed) to the
        launcher's stderr, under a line that says what they are."""
        with self._lock:
            tail = self._hidden_tails.get(rank)
            out = self._streams["stderr"]
            if not tail or out is None:
                return
            note = f"hororun: the last {_plural_lines(len(tail))} of rank {rank}'s stderr, which --rank-filter hid:\n"
            try:
                _write(out, note.encode() + b"".join(tail))
            except (OSError, ValueError):
                pass

    def _tell(self, message: str) -> None:
        """Says once, on the launcher's stderr where it still works, why output is being dropped."""
        for out in (self._streams["stderr"], sys.__stderr__):
            try:
                _write(out, (message + "\n").encode())
                return
            except (OSError, ValueError, AttributeError):
                continue

    def close(self) -> None:
        """Closes the per-rank files."""
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


def _plural_lines(count: int) -> str:
    return "line" if count == 1 else f"{count} lines"


def _write(stream: IO[str], data: bytes) -> None:
    """Writes a worker's bytes as they are to a text stream's binary buffer (whatever the stream's
    encoding, and binary output intact), or decoded as UTF-8 where it has none (a StringIO)."""
    raw = getattr(stream, "buffer", None)
    if raw is None:
        stream.write(data.decode("utf-8", errors="replace"))
        stream.flush()
        return
    stream.flush()  # what the launcher itself wrote to the stream comes first
    raw.write(data)
    raw.flush()


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
    pending = bytearray()
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
            sink.write_lines(rank, stream, [bytes(pending)])
    finally:
        os.close(fd)
