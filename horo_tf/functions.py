"""Variables and Python objects across ranks: ``broadcast_variables``, ``broadcast_object``,
``broadcast_object_fn`` and ``allgather_object``.

Objects travel as cloudpickle bytes in a uint8 tensor; their sizes travel first, so ranks may hold
objects of different sizes.
"""
import numpy as np
import tensorflow as tf

from horo_core import basics, object_bytes
from horo_core.process_sets import global_process_set
from horo_tf import _bridge, _chain, mpi_ops


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
    with _chain.standalone():  # in a TF1 graph, run alone: it waits on no training step's collective
        assignments = mpi_ops.assign_broadcast(var_list, root_rank, name, process_set)
    return tf.group(*assignments) if mpi_ops.in_tf1_graph() else var_list


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank (serialized with cloudpickle). Eagerly, or in a TF1
    graph through a session.

    Args:
        obj: any picklable object; only root_rank's value matters.
        root_rank: the global rank whose object is sent.
        session: in a TF1 graph, the session that runs the broadcasts (default: the default
            session); unused eagerly.
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        root_rank's object.
    Raises:
        ValueError: called inside a tf.function, or in a TF1 graph without a session; the root
            could not pickle obj (on every rank, after the broadcasts, so that later calls stay
            paired).
        HorovodInternalError: the broadcast failed.
    """
    run = _runner("broadcast_object", session)
    name = name or basics.auto_name("broadcast_object", process_set.process_set_id or 0)

    def broadcast(part):
        def send(array):
            with _chain.standalone():
                return run(mpi_ops.broadcast(tf.constant(array), root_rank, name=f"{name}.{part}",
                                             process_set=process_set, ignore_name_scope=True))
        return send

    return _broadcast_object(obj, root_rank, name, broadcast("size"), broadcast("data"))


def _broadcast_object(obj, root_rank, name, send_size, send_data):
    """root_rank's obj: its length, then its bytes, each through send_*(array) -> array."""
    is_root = basics.rank() == root_rank
    payload, error = object_bytes.serialise(obj) if is_root else (b"", None)
    length = int(send_size(np.array([object_bytes.announced_length(payload, error)], np.int64))[0])
    data = send_data(np.frombuffer(payload, dtype=np.uint8) if is_root else np.zeros([abs(length)], np.uint8))
    return object_bytes.broadcast_object("broadcast_object", name, length, data.tobytes(), root_rank, error)


def _runner(helper, session):
    """The function that turns a collective's result into a NumPy array: eagerly its value, in a
    TF1 graph session.run (Horovod's object helpers take a session for that).

    Raises:
        ValueError: inside a tf.function (the helpers need the values while they run), or in a TF1
            graph with neither session nor a default session.
    """
    if tf.executing_eagerly():
        return lambda tensor, feed=None: tensor.numpy()
    if tf.inside_function():
        raise ValueError(f"{helper} runs eagerly (or in a TF1 graph with a session); call it outside tf.function")
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise ValueError(f"{helper} in a TF1 graph runs its collectives in a session: pass session=, or call it "
                         f"inside `with session.as_default():`")
    return session.run


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns a function ``fn(obj)`` that broadcasts obj from root_rank, as broadcast_object does.
    In a TF1 graph the broadcasts are built once, here (as Horovod's), so fn also works once the
    graph is finalized (inside a MonitoredTrainingSession).

    Args:
        root_rank, session, name, process_set: as for broadcast_object.
    Returns:
        A callable taking one object.
    """
    if not mpi_ops.in_tf1_graph():
        def broadcast_fn(obj):
            return broadcast_object(obj, root_rank=root_rank, session=session, name=name, process_set=process_set)

        return broadcast_fn
    name = name or basics.auto_name("broadcast_object", process_set.process_set_id or 0)
    fed = [tf.compat.v1.placeholder(tf.int64, [1]), tf.compat.v1.placeholder(tf.uint8, [None])]
    with _chain.standalone():
        sent = [mpi_ops.broadcast(t, root_rank, name=f"{name}.{part}", process_set=process_set, ignore_name_scope=True)
                for t, part in zip(fed, ("size", "data"))]

    def broadcast_fn_tf1(obj):
        run = _runner("broadcast_object_fn", session)
        return _broadcast_object(obj, root_rank, name, lambda array: run(sent[0], {fed[0]: array}),
                                 lambda array: run(sent[1], {fed[1]: array}))

    return broadcast_fn_tf1


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj, in rank order (serialized with cloudpickle). Eagerly,
    or in a TF1 graph through a session.

    Args:
        obj: any picklable object.
        session: in a TF1 graph, the session that runs the allgathers (default: the default
            session); unused eagerly.
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        A list with one object per rank of process_set.
    Raises:
        ValueError: called inside a tf.function, or in a TF1 graph without a session; a rank could
            not pickle its object (on every rank, after the allgathers).
        HorovodInternalError: the allgather failed.
    """
    run = _runner("allgather_object", session)
    name = name or basics.auto_name("allgather_object", process_set.process_set_id or 0)
    payload, error = object_bytes.serialise(obj)
    with _chain.standalone():
        lengths = run(mpi_ops.allgather(tf.constant([object_bytes.announced_length(payload, error)], tf.int64),
                                        name=f"{name}.size", process_set=process_set, ignore_name_scope=True))
        data = run(mpi_ops.allgather(tf.constant(np.frombuffer(payload, dtype=np.uint8)), name=f"{name}.data",
                                     process_set=process_set, ignore_name_scope=True)).tobytes()
    return object_bytes.objects("allgather_object", name, lengths.tolist(), data, process_set.ranks, error)
