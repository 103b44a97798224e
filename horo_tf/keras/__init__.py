"""Horovod's ``horovod.tensorflow.keras`` API for Keras 3 (TensorFlow backend):
``import horo_tf.keras as hvd``.

Training with ``model.fit`` needs only ``DistributedOptimizer`` and the callbacks. The functions
below take NumPy arrays, numbers or tensors and, as Horovod's Keras functions do when executing
eagerly, return a tensor (``.numpy()`` gives the array; NumPy takes the tensor as it is).
"""
import inspect
import json
import zipfile

import keras
import numpy as np
import tensorflow as tf

from horo_core import __version__
from horo_core.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                              init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                              mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size, sycl_built,
                              start_timeline, stop_timeline, tcp_built)
from horo_core.errors import HoroInternalError, HorovodInternalError
from horo_core.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horo_tf import mpi_ops
from horo_tf.compression import Compression
from horo_tf.keras import callbacks
from horo_tf.keras.optimizer import (DistributedOptimizer, PartialDistributedOptimizer, _DistributedMixin,
                                    distributed_class_of)
from horo_tf.mpi_ops import Adasum, Average, Sum


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """Reduces value (array-like) across ranks.

    Args:
        value: a NumPy array, number or tensor; same shape on every rank.
        name: operation name.
        average: deprecated, use op.
        prescale_factor, postscale_factor: scale before and after the reduction.
        op: Average (default) or another reduce op.
        compression: the dtype the data travels in.
    Returns:
        A tensor.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    return mpi_ops.allreduce(tf.constant(value), average=average, name=name, op=op, compression=compression,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allgather(value, name=None):
    """Concatenates value (rank >= 1) from every rank along dimension 0; returns a tensor.

    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    return mpi_ops.allgather(tf.constant(value), name=name)


def broadcast(value, root_rank, name=None):
    """Returns root_rank's value on every rank as a tensor.

    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    return mpi_ops.broadcast(tf.constant(value), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """Reduces value across ranks and returns this rank's rows as a tensor.

    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    return mpi_ops.reducescatter(tf.constant(value), name=name, op=op)


def broadcast_global_variables(root_rank):
    """Horovod's Keras ``broadcast_global_variables``: the op that overwrites every TF1 global
    variable with root_rank's value (see ``horo_tf.broadcast_global_variables``).

    Raises:
        RuntimeError: when executing eagerly, as in Horovod: broadcast the model's variables with
            ``callbacks.BroadcastGlobalVariablesCallback`` or ``horo_tf.broadcast_variables``.
    """
    import horo_tf
    return horo_tf.broadcast_global_variables(root_rank)


def _optimizer_classes():
    classes = []
    for item in vars(keras.optimizers).values():
        if inspect.isclass(item) and issubclass(item, keras.optimizers.Optimizer) \
                and item is not keras.optimizers.Optimizer:
            classes.append(item)
    return classes


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False, **options):
    """Loads a saved Keras model whose optimizer becomes a DistributedOptimizer (its saved state
    included).

    Args:
        filepath: a ``.keras`` file, or a legacy ``.h5`` one.
        custom_optimizers: optimizer classes beyond keras.optimizers' that the model may use.
        custom_objects: passed to keras.models.load_model.
        compression: the compression of the restored DistributedOptimizer.
        legacy_opts: Horovod's switch to tf.keras.optimizers.legacy; Keras 3 has no legacy
            optimizers, so only False is accepted.
        options: more of DistributedOptimizer's keyword arguments (sparse_as_dense, op,
            backward_passes_per_step, ...), beyond Horovod's load_model: a rank that restores the
            model must reduce as the ranks that build their optimizer with them do.
    Returns:
        The compiled model.
    Raises:
        ValueError: the file cannot be loaded, or legacy_opts is true.
    """
    if legacy_opts:
        raise ValueError("load_model(legacy_opts=True): Keras 3 has no tf.keras.optimizers.legacy; "
                         "load with legacy_opts=False")
    objects = {}
    for cls in _optimizer_classes() + list(custom_optimizers or []):
        if issubclass(cls, keras.optimizers.LossScaleOptimizer):
            # Its inner optimizer is looked up here too: mapping both would reduce twice. A
            # LossScaleOptimizer whose inner optimizer is plain is wrapped below.
            continue
        # Its reductions are named after the optimizer's saved name, as DistributedOptimizer names
        # them: a rank that restores the checkpoint reduces with the ranks that build theirs.
        wrapped = distributed_class_of(cls, compression, **options)
        objects[cls.__name__] = wrapped
        objects[keras.saving.get_registered_name(cls)] = wrapped
        # A legacy .h5 file's loader looks built-in optimizers up by the lower-cased class name
        # ("adadelta"); without this key it silently builds the plain optimizer.
        objects[cls.__name__.lower()] = wrapped
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        return model
    if str(filepath).endswith((".h5", ".hdf5")):
        optimizer = model.optimizer = _rebuilt_from_h5(optimizer, model, filepath, objects)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and _saved_distributed_loss_scaling(filepath):
        # DistributedOptimizer(LossScaleOptimizer(opt)) was saved, which Keras loads the other way
        # round. Its reductions are named, and its finiteness agreed, differently: a rank that
        # restored it would wait for ever on ranks that build theirs as the file says.
        inner = optimizer.inner_optimizer
        config = optimizer.get_config()
        del config["inner_optimizer"]
        plain = _plain_class(type(optimizer))(_plain_class(type(inner)).from_config(inner.get_config()), **config)
        model.optimizer = _with_state_of(DistributedOptimizer(plain, compression=compression, **options), optimizer,
                                         model)
        return model
    distributed = isinstance(optimizer, _DistributedMixin) or (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        and isinstance(optimizer.inner_optimizer, _DistributedMixin))
    if not distributed:
        # A checkpoint written without Horovod names its optimizer as a built-in class, which Keras 3
        # builds from keras.optimizers whatever custom_objects says: wrap it now, state included.
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            # Only its inner optimizer: the LossScaleOptimizer's finiteness check is then agreed
            # between the ranks (optimizer.py), and nothing is reduced twice.
            config = optimizer.get_config()
            del config["inner_optimizer"]
            fresh = type(optimizer)(_distributed_copy(optimizer.inner_optimizer, objects, compression, options),
                                    **config)
        else:
            fresh = _distributed_copy(optimizer, objects, compression, options)
        model.optimizer = _with_state_of(fresh, optimizer, model)
    return model


def _saved_distributed_loss_scaling(filepath):
    """Whether the .keras file at filepath holds a LossScaleOptimizer that DistributedOptimizer
    wrapped. Keras records the registered name of the class it saves ("LossScaleOptimizer" for
    Horo's subclass of it, none for the built-in class)."""
    try:
        with zipfile.ZipFile(filepath) as archive:
            saved = json.loads(archive.read("config.json"))["compile_config"]["optimizer"]
        return saved.get("class_name") == "LossScaleOptimizer" and saved.get("registered_name") == "LossScaleOptimizer"
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):  # not a .keras file, or no optimizer
        return False


def _plain_class(cls):
    """The Keras optimizer class under a DistributedOptimizer's subclass (cls itself if plain)."""
    return next(c for c in cls.__mro__ if not issubclass(c, _DistributedMixin))


def _distributed_copy(optimizer, objects, compression, options):
    """An unbuilt DistributedOptimizer of optimizer's class and config (and so of its name, which
    names the reductions as DistributedOptimizer's: a rank that restores a checkpoint reduces its
    gradients with the ranks that build their optimizer)."""
    wrapped = distributed_class_of(type(optimizer), compression, **options)
    with keras.saving.custom_object_scope(objects):
        return wrapped.from_config(optimizer.get_config())


def _rebuilt_from_h5(optimizer, model, filepath, objects):
    """The optimizer of a model loaded from a legacy .h5 file, built on the model's trainable
    variables with the state the file holds.

    Keras 3's .h5 loader builds the optimizer on the variables the model object itself tracks (none
    for a Sequential or functional model), so the saved state does not load ("Error in loading the
    saved optimizer state") and the first step fails with "Unknown variable", with or without Horo:
    Horovod's resume from its examples' default ``checkpoint-{epoch}.h5`` would break. An optimizer
    saved before it was built (no training yet) is returned unbuilt, with its saved values."""
    trainable = model.trainable_variables
    known = {id(v) for v in getattr(optimizer, "_trainable_variables", [])}
    if not optimizer.built or all(id(v) in known for v in trainable):
        return optimizer
    import h5py
    from keras.src.legacy.saving import legacy_h5_format
    with keras.saving.custom_object_scope(objects):
        fresh = type(optimizer).from_config(optimizer.get_config())
    with h5py.File(filepath, "r") as f:
        saved = [np.asarray(d) for d in legacy_h5_format.load_optimizer_weights_from_hdf5_group(f)] \
            if "optimizer_weights" in f else []
    if len(saved) != len(fresh.variables):
        fresh.build(trainable)
    if len(saved) != len(fresh.variables):
        raise ValueError(f"load_model: {filepath} holds {len(saved)} optimizer weights, but its "
                         f"{type(optimizer).__name__} builds {len(fresh.variables)} on the model's trainable variables")
    for variable, value in zip(fresh.variables, saved):
        variable.assign(value)
    return fresh


def _with_state_of(fresh, loaded, model):
    """fresh, built on model's trainable variables and holding loaded's variables' values (its
    iterations, momenta...), if loaded is built."""
    if loaded.built:
        fresh.build(model.trainable_variables)
        if len(fresh.variables) != len(loaded.variables):
            raise ValueError(f"load_model: the restored {type(loaded).__name__} holds {len(loaded.variables)} "
                             f"variables, but it builds {len(fresh.variables)} on the model's trainable variables")
        for mine, saved in zip(fresh.variables, loaded.variables):
            mine.assign(saved)
    return fresh


def __getattr__(name):
    from horo_core.errors import missing_attribute
    raise missing_attribute(__name__, name)
