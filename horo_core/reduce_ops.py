"""Reduction operations as the adapters expose them (Horovod's names and integer values), and the
rule that turns Horovod's deprecated ``average`` argument into an op."""
import warnings

from horo_core._binding import lib
from horo_core.errors import HoroInvalidArgument

Average = lib.HORO_OP_AVERAGE
Sum = lib.HORO_OP_SUM
Adasum = lib.HORO_OP_ADASUM
Min = lib.HORO_OP_MIN
Max = lib.HORO_OP_MAX
Product = lib.HORO_OP_PRODUCT


_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


def name_of(op):
    """The op's name ("Adasum") for messages; repr of anything that is not an op."""
    return _NAMES.get(op, repr(op)) if isinstance(op, int) else repr(op)


BOTH_AVERAGE_AND_OP = "The op parameter supersedes average. Please provide only one of them."


class _AverageAndOp:
    """resolve_op's answer for a collective given both average and op: no op at all. Made into the
    core's op code (Runtime._options) it raises Horovod's ValueError, as a HoroInvalidArgument that
    the runtime makes a refusal on every member of the set: a rank that alone raised at once would
    leave the others waiting for it."""

    __slots__ = ()

    def __index__(self):
        raise HoroInvalidArgument(BOTH_AVERAGE_AND_OP)

    def __repr__(self):
        return "<both average and op>"


_AVERAGE_AND_OP = _AverageAndOp()


def resolve_op(average, op, default=Average, stacklevel=3):
    """The op a collective uses given Horovod's (average, op) pair; ``average`` alone warns, as in
    Horovod (stacklevel: as warnings.warn's, 3 for a public function that calls this one directly).
    Both given: a value that is no op, which the collective refuses on every rank with Horovod's
    ValueError (_AverageAndOp)."""
    if average is None:
        return default if op is None else op
    if op is not None:
        return _AVERAGE_AND_OP
    warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                  DeprecationWarning, stacklevel=stacklevel)
    return Average if average else Sum


def handle_average_backwards_compatibility(op, average):
    """Horovod's helper, exported by its adapters: the op given (op, average), Average when neither
    is set.

    Raises:
        ValueError: both op and average were given.
    """
    if op is not None and average is not None:
        raise ValueError(BOTH_AVERAGE_AND_OP)
    return resolve_op(average, op)


def check_num_rank_power_of_2(num_rank):
    """Whether num_rank is a power of two (Horovod's helper, exported by its TensorFlow adapter)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0
