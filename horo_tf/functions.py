"""Variables and Python objects across ranks: ``broadcast_variables``, ``broadcast_object``,
``broadcast_object_fn`` and ``allgather_object``.

Objects travel as cloudpickle bytes in a uint8 tensor; their sizes travel first, so ranks may hold
objects of different sizes.
"""
import numpy as np
import tensorflow as tf

from horo_core import basics, object_bytes
from horo_core.process_sets import global_process_set
from horo_tf import _bridge, mpi_ops


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Overwrites every variable with root_rank's value, as one fused group.

    Args:
        variables: an iterable of tf.Variable or Keras variables (model.variables,
            optimizer.variables...).
        root_rank: the global rank whose values are kept.
        process_set: the ranks taking part.
        inplace: accepted for Horovod compatibility; variables are always assigned in place.
    Returns:
        The list of variables; in a TF1 graph, as Horovod's, the ``tf.group`` of the assignments,
        for ``session.run``.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the broadcast failed.
    """
    var_list = list(variables)
    if not var_list:
        return tf.group() if mpi_ops.in_tf1_graph() else []
    name = _bridge.auto_name("broadcast_variables", process_set.process_set_id or 0, var_list)
    assignments = mpi_ops.assign_broadcast(var_list, root_rank, name, process_set)
    return tf.group(*assignments) if mpi_ops.in_tf1_graph() else var_list


def _bytes_tensor(payload):
    return tf.constant(np.frombuffer(payload, dtype=np.uint8))


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank (serialized with cloudpickle). Eager only.

    Args:
        obj: any picklable object; only root_rank's value matters.
        root_rank: the global rank whose object is sent.
        session: accepted for Horovod compatibility (TF1 sessions are not supported).
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        root_rank's object.
    Raises:
        ValueError: called inside a tf.function; on the other ranks, the root could not pickle obj
            (the root raises pickling's own error, after the broadcasts, so later calls stay paired).
        HorovodInternalError: the broadcast failed.
    """
    if not tf.executing_eagerly():
        raise ValueError("broadcast_object runs eagerly only; call it outside tf.function")
    name = name or basics.auto_name("broadcast_object", process_set.process_set_id or 0)
    is_root = basics.rank() == root_rank
    payload, error = object_bytes.serialise(obj) if is_root else (b"", None)
    length = mpi_ops.broadcast(tf.constant([object_bytes.announced_length(payload, error)], tf.int64), root_rank,
                               name=f"{name}.size", process_set=process_set, ignore_name_scope=True)
    length = int(length[0])
    data = mpi_ops.broadcast(_bytes_tensor(payload) if is_root else tf.zeros([abs(length)], tf.uint8), root_rank,
                             name=f"{name}.data", process_set=process_set, ignore_name_scope=True)
    return object_bytes.broadcast_object("broadcast_object", name, length, data.numpy().tobytes(), root_rank, error)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns a function ``fn(obj)`` that broadcasts obj from root_rank, as broadcast_object does.

    Args:
        root_rank, session, name, process_set: as for broadcast_object.
    Returns:
        A callable taking one object.
    """
    def broadcast_fn(obj):
        return broadcast_object(obj, root_rank=root_rank, session=session, name=name, process_set=process_set)

    return broadcast_fn


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj, in rank order (serialized with cloudpickle). Eager only.

    Args:
        obj: any picklable object.
        session: accepted for Horovod compatibility (TF1 sessions are not supported).
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        A list with one object per rank of process_set.
    Raises:
        ValueError: called inside a tf.function; another rank could not pickle its object (this rank
            raises pickling's own error when it could not: every rank fails, after the allgathers).
        HorovodInternalError: the allgather failed.
    """
    if not tf.executing_eagerly():
        raise ValueError("allgather_object runs eagerly only; call it outside tf.function")
    name = name or basics.auto_name("allgather_object", process_set.process_set_id or 0)
    payload, error = object_bytes.serialise(obj)
    lengths = mpi_ops.allgather(tf.constant([object_bytes.announced_length(payload, error)], tf.int64),
                                name=f"{name}.size", process_set=process_set, ignore_name_scope=True).numpy()
    data = mpi_ops.allgather(_bytes_tensor(payload), name=f"{name}.data", process_set=process_set,
                             ignore_name_scope=True).numpy().tobytes()
    return object_bytes.objects("allgather_object", name, lengths.tolist(), data, process_set.ranks, error)
