"""Reduction operations as the adapters expose them (Horovod's names and integer values), and the
rule that turns Horovod's deprecated ``average`` argument into an op."""
import warnings

from horo_core._binding import lib

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


def resolve_op(average, op, default=Average, stacklevel=3):
    """The op to use given Horovod's (average, op) pair; ``average`` alone warns, as in Horovod
    (stacklevel: as warnings.warn's, 3 for a public function that calls this one directly).

    Raises:
        ValueError: both average and op were given.
    """
    if average is None:
        return default if op is None else op
    if op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                  DeprecationWarning, stacklevel=stacklevel)
    return Average if average else Sum


def handle_average_backwards_compatibility(op, average):
    """Horovod's helper, exported by its adapters: the op given (op, average), Average when neither
    is set.

    Raises:
        ValueError: both op and average were given.
    """
    return resolve_op(average, op)


def check_num_rank_power_of_2(num_rank):
    """Whether num_rank is a power of two (Horovod's helper, exported by its TensorFlow adapter)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0
