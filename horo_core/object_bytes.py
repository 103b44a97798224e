"""The bytes that ``broadcast_object`` and ``allgather_object`` (horo_torch and horo_tf) move.

An object travels as its cloudpickle bytes, announced first by their length. A rank that cannot
pickle its object still takes part in both collectives, so that the ranks' later calls stay
paired: it announces minus the length of its error's text and sends that text instead of an
object. Every rank then raises the same HoroInvalidArgument, which names the collective and the
rank and quotes its error (on that rank, raised from pickling's own exception).
"""
from typing import List, Optional, Sequence, Tuple

import cloudpickle

from horo_core.errors import HoroInvalidArgument


def serialise(obj) -> Tuple[bytes, Optional[Exception]]:
    """(obj's pickle, None), or (the text of the error pickling raised, that error)."""
    try:
        return cloudpickle.dumps(obj), None
    except Exception as error:  # noqa: BLE001 - whatever pickling raises is reported to every rank
        return f"{type(error).__name__}: {error}".encode(errors="replace"), error


def announced_length(payload: bytes, error: Optional[Exception]) -> int:
    """The length a rank announces for payload: negative when payload is an error's text."""
    return -len(payload) if error is not None else len(payload)


def objects(kind: str, name: str, lengths: Sequence[int], data: bytes, ranks: Sequence[int],
            own_error: Optional[Exception]) -> List[object]:
    """Unpickles the objects gathered from ranks (global ranks, in the order of lengths).

    Raises:
        HoroInvalidArgument: a rank could not pickle its object (this one: from own_error).
    """
    pieces, offset = [], 0
    for length in lengths:
        pieces.append(data[offset:offset + abs(length)])
        offset += abs(length)
    failed = [f"rank {rank} could not serialise its object ({piece.decode(errors='replace')})"
              for rank, length, piece in zip(ranks, lengths, pieces) if length < 0]
    if failed:
        raise HoroInvalidArgument(f"{kind} '{name}': " + "; ".join(failed)) from own_error
    return [cloudpickle.loads(piece) for piece in pieces]


def broadcast_object(kind: str, name: str, length: int, data: bytes, root_rank: int,
                     own_error: Optional[Exception]):
    """Unpickles the object root_rank broadcast (length as it announced it).

    Raises:
        HoroInvalidArgument: the root could not pickle its object.
    """
    return objects(kind, name, [length], data, [root_rank], own_error)[0]
