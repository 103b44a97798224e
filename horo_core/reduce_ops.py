"""Reduction operations as the adapters expose them (Horovod's names and integer values), and the
rule that turns Horovod's deprecated ``average`` argument into an op."""
from horo_core._binding import lib

Average = lib.HORO_OP_AVERAGE
Sum = lib.HORO_OP_SUM
Adasum = lib.HORO_OP_ADASUM
Min = lib.HORO_OP_MIN
Max = lib.HORO_OP_MAX
Product = lib.HORO_OP_PRODUCT


def resolve_op(average, op, default=Average):
    """The op to use given Horovod's (average, op) pair.

    Raises:
        ValueError: both average and op were given.
    """
    if average is not None and op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        return default if average is None else (Average if average else Sum)
    return op
