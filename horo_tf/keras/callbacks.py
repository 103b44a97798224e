"""Keras 3 callbacks for data-parallel training, with Horovod's names and arguments.

* ``BroadcastGlobalVariablesCallback``: every rank starts from root_rank's weights and optimizer state.
* ``MetricAverageCallback``: epoch-end metrics are averaged across ranks.
* ``LearningRateScheduleCallback`` / ``LearningRateWarmupCallback``: set
  ``optimizer.learning_rate`` per epoch or per batch (the warmup ramps from lr/size to lr).
* ``BestModelCheckpoint``: ``ModelCheckpoint(save_best_only=True)`` written by rank 0 only.
"""
import keras
import numpy as np
import tensorflow as tf

from horo_core import basics
from horo_tf import mpi_ops
from horo_tf.functions import allgather_object, broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts the model's variables and the optimizer's from root_rank when training starts.

    The random state of Dropout, noise and augmentation layers (Keras 3 seed generators) is left
    alone, so that ranks keep drawing different masks.

    When every rank holds the same variables at ``on_train_begin`` (shapes and dtypes compared),
    they are broadcast then, before the first step. Variables that the first step creates (a model
    without an ``Input`` or a subclassed model, which Keras builds on its first batch; an optimizer
    not built yet) are broadcast after the first batch, as Horovod broadcasts everything then. So is
    everything when the ranks start at different build states (rank 0 restored a checkpoint with
    ``load_model``, or built the model to print its summary, while the others did not); where only
    the optimizers differ (rank 0's restored, the others' not built yet), the model's variables are
    broadcast before the first step as well, so that its gradients, which every rank takes at rank
    0's weights, are the ones training on from the checkpoint would give, and rank 0's first update
    is that of the checkpoint's optimizer state.

    Args:
        root_rank: the global rank whose values every rank takes.
        device: accepted for Horovod compatibility.
        local_variables: variables to leave alone (a variable or a list).
    Raises:
        ValueError (on every rank): after the first batch, the ranks still hold different variables.
    """

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple)):
            local_variables = [local_variables]
        self._local = {id(v) for v in local_variables}
        self._first_batch = False
        self._done = set()  # ids of the variables broadcast at on_train_begin

    def _model_and_optimizer_variables(self):
        optimizer = getattr(self.model, "optimizer", None)
        optimizer_variables = list(optimizer.variables) if optimizer is not None and optimizer.built else []
        return [[v for v in variables if id(v) not in self._local and not _is_seed_state(v)]
                for variables in (self.model.variables, optimizer_variables)]

    def _variables(self):
        model_variables, optimizer_variables = self._model_and_optimizer_variables()
        return model_variables + optimizer_variables

    def _layouts(self, variables, when):
        """Every rank's (shape, dtype) list of its variables, in rank order (a collective); a None
        in variables stays None (a separator)."""
        layout = [None if v is None else (tuple(v.shape), str(v.dtype)) for v in variables]
        return allgather_object(layout, name=f"BroadcastGlobalVariablesCallback.{when}")

    def on_train_begin(self, logs=None):
        model_variables, optimizer_variables = self._model_and_optimizer_variables()
        # One collective: each rank's layout of its model's variables, then of its optimizer's.
        layouts = self._layouts(model_variables + [None] + optimizer_variables, "train_begin")
        models = layouts[0].index(None) + 1  # rank 0's model part, separator included: alike on every rank
        self._done = set()
        if all(layout[:models] == layouts[0][:models] for layout in layouts):
            same_optimizers = all(layout == layouts[0] for layout in layouts)
            now = model_variables + (optimizer_variables if same_optimizers else [])
            broadcast_variables(now, root_rank=self.root_rank)
            # Where the optimizers differ, the first step's updates differ too: everything is
            # broadcast again after it.
            self._done = {id(v) for v in now} if same_optimizers else set()
        self._first_batch = True

    def on_batch_end(self, batch, logs=None):
        if not self._first_batch:
            return
        self._first_batch = False
        created = [v for v in self._variables() if id(v) not in self._done]
        self._done = set()
        layouts = self._layouts(created, "first_batch")
        root = layouts[self.root_rank]
        for rank, layout in enumerate(layouts):
            if layout != root:
                raise ValueError(f"BroadcastGlobalVariablesCallback: after the first batch, rank {rank} has "
                                 f"{len(layout)} variables to take from root rank {self.root_rank}, which has "
                                 f"{len(root)}, or their shapes or dtypes differ (first difference: "
                                 f"{_first_difference(layout, root)}); every rank must build the same model "
                                 f"and optimizer")
        if created:
            broadcast_variables(created, root_rank=self.root_rank)

    on_train_batch_end = on_batch_end  # (see LearningRateScheduleCallback)


def _first_difference(layout, root):
    for i, (mine, theirs) in enumerate(zip(layout, root)):
        if mine != theirs:
            return f"variable {i} is {mine[1]} {list(mine[0])} there, {theirs[1]} {list(theirs[0])} on the root"
    return f"variable {min(len(layout), len(root))} exists on one of them only"


def _is_seed_state(variable):
    """Keras 3 keeps the random state of Dropout, noise and augmentation layers in variables named
    seed_generator_state. Broadcasting them would give every rank the same dropout masks and
    augmentations: the ranks' randomness stays their own, as under Horovod (tf.keras 2 had no such
    variables)."""
    return getattr(variable, "name", None) == "seed_generator_state"


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces every numeric value in the epoch-end logs, scalar or array, by its average over all
    ranks.

    Place it before callbacks that read the logs (checkpoints, early stopping, LR on plateau).

    Args:
        device: accepted for Horovod compatibility.
    """

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        arrays = {k: np.asarray(v) for k, v in logs.items()}
        names = sorted(k for k, v in arrays.items() if np.issubdtype(v.dtype, np.number))
        # The ranks must average the same metrics of the same shapes: one that logs other metrics,
        # or none, would pair its values with the wrong ones, or leave the others waiting.
        layout = [(k, arrays[k].shape) for k in names]
        layouts = allgather_object(layout, name=f"MetricAverageCallback.layout.{epoch}")
        for rank, other in enumerate(layouts):
            if other != layout:
                raise ValueError(f"MetricAverageCallback: at the end of epoch {epoch} rank {basics.rank()} logs "
                                 f"the metrics {_describe(layout)} and rank {rank} {_describe(other)}; every rank "
                                 "must log the same metrics with the same shapes")
        if not names:
            return
        # One allreduce for all of them, vector metrics (a per-class F1Score) included.
        flat = tf.constant(np.concatenate([arrays[k].astype(np.float64).ravel() for k in names]), tf.float64)
        averaged = mpi_ops.allreduce(flat, op=mpi_ops.Average, name=f"MetricAverageCallback.{epoch}",
                                     ignore_name_scope=True).numpy()
        start = 0
        for k in names:
            value = arrays[k]
            part = averaged[start:start + value.size]
            start += value.size
            if value.ndim == 0:
                logs[k] = float(part[0])
            else:
                kind = value.dtype if np.issubdtype(value.dtype, np.floating) else np.float64
                logs[k] = part.reshape(value.shape).astype(kind)


def _describe(layout):
    return ", ".join(f"{name}{list(shape) if shape else ''}" for name, shape in layout) or "none"


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` between start_epoch and end_epoch.

    Args:
        initial_lr: the learning rate the multiplier scales (usually the size-scaled rate).
        multiplier: a function of the (fractional, when not staircase) epoch, or a constant m for
            exponential decay: ``initial_lr * m ** (epoch - start_epoch)``.
        start_epoch: first epoch adjusted.
        end_epoch: first epoch no longer adjusted (None: to the end).
        staircase: adjust once per epoch (True) or every batch with a fractional epoch.
        momentum_correction: scale the optimizer's momentum by new_lr/old_lr for the batch where the
            rate changes. Keras 3 optimizers compile momentum into the training step as a constant,
            so this takes effect only for optimizers whose ``momentum`` is a variable.
        steps_per_epoch: batches per epoch (detected from fit when None).
    Raises:
        ValueError: initial_lr is None, or steps_per_epoch is needed and cannot be detected.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self._restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            # A constant is exponential decay from start_epoch, as in Horovod since 0.23:
            # initial_lr, initial_lr * m, initial_lr * m**2, ... (per batch when not staircase).
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self):
        steps = self.params.get("steps") if self.params else None
        if steps:
            return steps
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify the steps_per_epoch "
                         "parameter to the callback.")

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = float(np.asarray(optimizer.learning_rate))
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        momentum = getattr(optimizer, "momentum", None)
        if self.momentum_correction and isinstance(momentum, (tf.Variable, keras.Variable)) and old_lr:
            self._restore_momentum = float(np.asarray(momentum))
            momentum.assign(self._restore_momentum * new_lr / old_lr)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (self.end_epoch is not None
                                                     and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            # With steps_per_execution > 1 Keras calls this once per execution, at its first batch,
            # and the rate set holds for all of its batches: it is the one of its last batch, so
            # that a ramp still ends where it would batch by batch (the warmup at initial_lr).
            per_call = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
            last = batch + per_call - 1
            steps = (self.params or {}).get("steps")
            if steps:  # the epoch's last execution may be shorter
                last = min(last, steps - 1)
            self._adjust_learning_rate(self.current_epoch + float(last) / self.steps_per_epoch)

    def on_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            self.model.optimizer.momentum.assign(self._restore_momentum)
            self._restore_momentum = None

    # Horovod's callbacks act in on_batch_begin/on_batch_end, which a custom loop may call itself;
    # Keras 3 calls the train_ forms, and looks for them overridden before it calls batch hooks.
    on_train_batch_begin = on_batch_begin
    on_train_batch_end = on_batch_end

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            # Keras 3's name for it, and Horovod's (Keras 2's), which scripts read from the history.
            logs["learning_rate"] = logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from initial_lr/size to initial_lr over warmup_epochs (Goyal et al.).

    Args:
        initial_lr: the rate reached at the end of the warmup (usually base_lr * size).
        warmup_epochs: epochs the ramp lasts.
        momentum_correction: see LearningRateScheduleCallback.
        steps_per_epoch: batches per epoch (detected from fit when None).
        verbose: rank 0 prints a line when the warmup ends.
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Shifted by one batch so that the ramp ends exactly at initial_lr on the last batch.
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / basics.size() * (epoch * (basics.size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            lr = float(np.asarray(self.model.optimizer.learning_rate))
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keeps the best model seen so far at filepath, written by rank 0 only.

    Unlike Horovod's (whose Spark estimator fills the path in), filepath is given here.

    Args:
        filepath: where to save (``.keras``, or ``.weights.h5`` with save_weights_only).
        monitor, verbose, save_weights_only, mode, save_freq: as for keras.callbacks.ModelCheckpoint.
    """

    def __init__(self, filepath, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch"):
        super().__init__(filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def _save_model(self, epoch, batch, logs):
        if basics.rank() == 0:
            super()._save_model(epoch, batch, logs)
