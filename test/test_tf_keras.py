"""horo_tf.keras on Keras 3: DistributedOptimizer (mixed precision and sparse embedding gradients
included), the callbacks, load_model and SyncBatchNormalization in model.fit, in one 2-rank launch.

The equivalence checks train the same model twice on every rank: distributed on this rank's shard,
and with the plain optimizer on the concatenation of every rank's batch; the weights must agree
to float32 rounding.
"""
import contextlib
import io
import itertools
import subprocess
import sys

import numpy as np

import horo_runner
from tf_checks import CHILD_ENV, assert_reports, run_groups

BATCH = 4      # per rank
STEPS = 4      # batches per epoch on each rank
FEATURES = 5


def data(n):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(n * BATCH * STEPS, FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1).astype(np.float32)
    return x, y


def shard_and_global(n, r, passes=1):
    """This rank's rows, and the rows a single process sees when one update covers every rank's
    `passes` consecutive batches."""
    x, y = data(n)
    shards = [np.arange(len(x))[s::n] for s in range(n)]
    per_update = BATCH * passes
    order = np.concatenate([np.concatenate([shards[s][k:k + per_update] for s in range(n)])
                            for k in range(0, len(shards[0]), per_update)])
    return (x[shards[r]], y[shards[r]]), (x[order], y[order]), n * per_update


def make_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(6, activation="tanh"),
                             keras.layers.Dense(1)])


def adamw_sparing_biases(keras, **kw):
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5, **kw)
    optimizer.exclude_from_weight_decay(var_names=["bias"])  # not in the optimizer's config
    return optimizer


OPTIMIZERS = {"SGD momentum": lambda keras, **kw: keras.optimizers.SGD(0.05, momentum=0.9, **kw),
              "Adam": lambda keras, **kw: keras.optimizers.Adam(0.01, **kw),
              "AdamW sparing biases": adamw_sparing_biases}


def check_fit_equivalence(c, hvd, keras, tf):
    import horo_tf
    n, r = hvd.size(), hvd.rank()
    for name, make_opt in OPTIMIZERS.items():
        for passes in (1, 2):
            (xs, ys), (xg, yg), global_batch = shard_and_global(n, r, passes)
            dist = make_model(keras, seed=100 + r)  # different on every rank until the broadcast
            # horovod.tensorflow.DistributedOptimizer (horo_tf's) delegates a Keras optimizer here.
            wrap = horo_tf.DistributedOptimizer if name == "Adam" else hvd.DistributedOptimizer
            dist.compile(optimizer=wrap(make_opt(keras), backward_passes_per_step=passes,
                                        average_aggregated_gradients=True), loss="mse")
            dist.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
            ref = make_model(keras, seed=100)
            ref.compile(optimizer=make_opt(keras), loss="mse")
            ref.fit(xg, yg, batch_size=global_batch, epochs=2, shuffle=False, verbose=0)
            for i, (a, b) in enumerate(zip(dist.get_weights(), ref.get_weights())):
                c.close(f"fit {name} backward_passes_per_step={passes} weight {i}", a, b)
            c.same(f"fit {name} passes={passes} iterations count updates",
                   int(dist.optimizer.iterations.numpy()), 2 * STEPS // passes)
    # The exclusions of an AdamW inside a LossScaleOptimizer survive the wrapping too.
    bias, kernel = keras.Variable([1.0], name="bias"), keras.Variable([1.0], name="kernel")
    scaled = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(adamw_sparing_biases(keras)))
    c.same("exclude_from_weight_decay inside a LossScaleOptimizer",
           [scaled.inner_optimizer._use_weight_decay(v) for v in (bias, kernel)], [False, True])


def check_gradient_accumulation(c, hvd, keras, tf):
    """Keras's own gradient_accumulation_steps on the wrapped optimizer averages per micro-step."""
    n, r = hvd.size(), hvd.rank()
    (xs, ys), (xg, yg), _ = shard_and_global(n, r, 1)
    dist = make_model(keras, seed=100)
    dist.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS["Adam"](keras, gradient_accumulation_steps=2)),
                 loss="mse")
    dist.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    ref = make_model(keras, seed=100)
    ref.compile(optimizer=OPTIMIZERS["Adam"](keras, gradient_accumulation_steps=2), loss="mse")
    ref.fit(xg, yg, batch_size=n * BATCH, epochs=1, shuffle=False, verbose=0)
    for i, (a, b) in enumerate(zip(dist.get_weights(), ref.get_weights())):
        c.close(f"gradient_accumulation_steps=2 weight {i}", a, b)


def check_custom_loop(c, hvd, keras, tf):
    """A tf.function loop calling apply_gradients on a DistributedOptimizer with 2 passes per step."""
    n, r = hvd.size(), hvd.rank()
    (xs, ys), (xg, yg), global_batch = shard_and_global(n, r, 2)
    dist, ref = make_model(keras, 100), make_model(keras, 100)
    dist_opt = hvd.DistributedOptimizer(OPTIMIZERS["SGD momentum"](keras), backward_passes_per_step=2)
    ref_opt = OPTIMIZERS["SGD momentum"](keras)

    @tf.function
    def dist_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((dist(x) - y) ** 2)
        dist_opt.apply_gradients(zip(tape.gradient(loss, dist.trainable_variables), dist.trainable_variables))

    for k in range(STEPS):
        dist_step(xs[k * BATCH:(k + 1) * BATCH], ys[k * BATCH:(k + 1) * BATCH])
    for k in range(STEPS // 2):
        xb, yb = xg[k * global_batch:(k + 1) * global_batch], yg[k * global_batch:(k + 1) * global_batch]
        with tf.GradientTape() as tape:
            # Summed passes (average_aggregated_gradients=False): twice the mean gradient.
            loss = 2.0 * tf.reduce_mean((ref(xb) - yb) ** 2)
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    for i, (a, b) in enumerate(zip(dist.get_weights(), ref.get_weights())):
        c.close(f"custom loop passes=2 weight {i}", a, b)


class _Recorder:
    """A Keras callback factory that records the epoch-end logs it sees."""

    @staticmethod
    def make(keras, seen):
        class Recorder(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                seen.append(dict(logs))
        return Recorder()


def check_callbacks(c, hvd, keras, tf):
    n, r = hvd.size(), hvd.rank()
    c.raises("keras broadcast_global_variables, eagerly", [RuntimeError], "does not support eager execution",
             lambda: hvd.broadcast_global_variables(0))
    (xs, ys), _, _ = shard_and_global(n, r)
    raw, averaged = [], []
    model = make_model(keras, 100)
    base_lr = 0.01

    class Spread(keras.metrics.Metric):  # a vector metric, as F1Score(average=None) is
        def __init__(self):
            super().__init__(name="spread")
            self.total = self.add_variable(shape=(2,), initializer="zeros", name="total")

        def update_state(self, y_true, y_pred, sample_weight=None):
            error = keras.ops.abs(y_true - y_pred)
            self.total.assign_add(keras.ops.stack([keras.ops.sum(error), keras.ops.max(error)]))

        def result(self):
            return self.total

    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(base_lr)), loss="mse",
                  metrics=["mae", Spread()])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        model.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_data=(xs, ys),
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvd.callbacks.LearningRateWarmupCallback(base_lr * n, warmup_epochs=2, verbose=1),
                             _Recorder.make(keras, raw), hvd.callbacks.MetricAverageCallback(),
                             _Recorder.make(keras, averaged)])
    c.same("the warmup's verbose line comes from rank 0 only",
           "finished gradual learning rate warmup" in printed.getvalue(), r == 0)
    import horo_tf
    everyone = horo_tf.allgather_object(raw)
    for epoch in range(2):
        for key in ("loss", "mae", "val_loss", "val_mae", "spread", "val_spread"):
            c.close(f"MetricAverageCallback epoch {epoch} {key}", averaged[epoch][key],
                    np.mean([logs[epoch][key] for logs in everyone], axis=0))
        c.same(f"a vector metric keeps its shape, epoch {epoch}", np.shape(averaged[epoch]["spread"]), (2,))
    c.close("warmup ends at initial_lr", float(model.optimizer.learning_rate.numpy()), base_lr * n)
    # With steps_per_execution the callback runs once per execution and sets the rate of its last
    # batch: the ramp still ends at initial_lr, whether or not the executions divide the epoch.
    for per_call in (2, 3):
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(base_lr)), loss="mse",
                      steps_per_execution=per_call)
        executed = []
        model.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.LearningRateWarmupCallback(base_lr * n, warmup_epochs=2),
                             _Recorder.make(keras, executed)])
        c.close(f"warmup with steps_per_execution={per_call} halfway after epoch 0", executed[0]["learning_rate"],
                base_lr * ((n - 1) / 2 + 1))
        c.close(f"warmup with steps_per_execution={per_call} ends at initial_lr",
                float(model.optimizer.learning_rate.numpy()), base_lr * n)
    # Ranks that log different metrics (or none) are told so, on every rank, instead of pairing
    # their values with the wrong ones or leaving the others waiting.
    average = hvd.callbacks.MetricAverageCallback()
    for what, logs in (("an extra metric", {"loss": 1.0, "extra": 2.0}), ("no metrics", {}),
                       ("another shape", {"loss": np.ones(2)})):
        c.raises(f"MetricAverageCallback with {what} on rank 1", [ValueError],
                 "every rank must log the same metrics with the same shapes",
                 lambda: average.on_epoch_end(7, dict(logs) if r == 1 else {"loss": 1.0}))
    # The last batch of epoch 0 is one epoch into the two-epoch ramp from base_lr to base_lr * n.
    c.close("warmup halfway after epoch 0", raw[0]["learning_rate"], base_lr * ((n - 1) / 2 + 1))
    c.same("warmup raises the rate", raw[0]["learning_rate"] < raw[1]["learning_rate"], True)
    c.same("the rate is logged under Horovod's name too", [logs["lr"] for logs in raw],
           [logs["learning_rate"] for logs in raw])

    # A constant multiplier decays exponentially from start_epoch (Horovod >= 0.23).
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
    seen = []
    model.fit(xs, ys, batch_size=BATCH, epochs=4, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.LearningRateScheduleCallback(0.2, 0.5, start_epoch=1, end_epoch=3),
                         _Recorder.make(keras, seen)])
    c.close("schedule: before start_epoch", seen[0]["learning_rate"], 0.3)
    c.close("schedule: start_epoch", seen[1]["learning_rate"], 0.2)
    c.close("schedule: one epoch later", seen[2]["learning_rate"], 0.1)
    c.close("schedule: after end_epoch keeps the last rate", seen[3]["learning_rate"], 0.1)
    # Not staircase: the same decay per batch, with the fractional epoch of the last batch.
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
    seen = []
    model.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.LearningRateScheduleCallback(0.2, 0.5, staircase=False),
                         _Recorder.make(keras, seen)])
    steps = -(-len(xs) // BATCH)
    for epoch in range(2):
        c.close(f"schedule per batch: epoch {epoch}", seen[epoch]["learning_rate"],
                0.2 * 0.5 ** (epoch + (steps - 1) / steps))
    # Horovod's callbacks act in on_batch_begin and on_batch_end, which a custom loop may call itself.
    warmup = hvd.callbacks.LearningRateWarmupCallback(0.2 * n, warmup_epochs=1, steps_per_epoch=4)
    warmup.set_model(model)
    warmup.on_train_begin()
    warmup.on_epoch_begin(0)
    warmup.on_batch_begin(1)
    c.close("warmup through on_batch_begin, batch 1 of 4", float(model.optimizer.learning_rate.numpy()),
            0.2 * (0.5 * (n - 1) + 1))


def check_broadcast_of_models_built_by_their_first_step(c, hvd, keras, tf):
    """A Sequential without an Input (Horovod's tensorflow2_keras_mnist.py) and a subclassed model
    have no variables at on_train_begin; Keras creates them in the first step. The callback must
    still leave every rank with root_rank's weights."""
    n, r = hvd.size(), hvd.rank()
    (xs, ys), _, _ = shard_and_global(n, r)

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(6, activation="tanh")
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(x))

    models = {"Sequential without Input": lambda: keras.Sequential([keras.layers.Dense(6, activation="tanh"),
                                                                     keras.layers.Dense(1)]),
              "subclassed": Subclassed}
    for what, make in models.items():
        keras.utils.set_random_seed(300 + r)  # different weights on every rank until the broadcast
        model = make()
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
        c.same(f"{what}: no variables before fit", len(model.variables), 0)
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        state = model.get_weights() + [v.numpy() for v in model.optimizer.variables]
        for i, value in enumerate(state):
            root = np.asarray(hvd.broadcast(value, 0, name=f"built_by_first_step.{what}.{i}"))
            c.same(f"{what}: variable {i} is root_rank's", bool(np.array_equal(value, root)), True)

    # Dropout's random state (a Keras 3 seed generator variable) is not broadcast: the ranks keep
    # drawing different masks while their weights agree.
    keras.utils.set_random_seed(400 + r)
    model = keras.Sequential([keras.Input((xs.shape[1],)), keras.layers.Dense(6), keras.layers.Dropout(0.5),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    seeds = [v.numpy() for v in model.variables if v.name == "seed_generator_state"]
    c.same("one dropout seed state", len(seeds), 1)
    import horo_tf
    everyone = horo_tf.allgather_object(seeds[0].tolist())
    c.same("dropout seed states differ between ranks", len({str(s) for s in everyone}), n)
    for i, value in enumerate(model.get_weights()):
        root = np.asarray(hvd.broadcast(value, 0, name=f"dropout_model.{i}"))
        c.same(f"dropout model: weight {i} is root_rank's", bool(np.array_equal(value, root)), True)


def check_checkpoint_and_load(c, hvd, keras, tf):
    import os
    import tempfile
    n, r = hvd.size(), hvd.rank()
    (xs, ys), _, _ = shard_and_global(n, r)
    model = make_model(keras, 100)
    # Not loss="mse": Keras 3 cannot load that alias back from a legacy .h5 file, with or without Horo.
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mean_squared_error")
    with tempfile.TemporaryDirectory() as tmp:
        best = os.path.join(tmp, f"best-rank{r}.keras")
        model.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_data=(xs, ys),
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvd.callbacks.BestModelCheckpoint(best, monitor="val_loss")])
        c.same("BestModelCheckpoint writes on rank 0 only", os.path.exists(best), r == 0)
        path = os.path.join(tmp, f"model-rank{r}.keras")
        model.save(path)
        plain = keras.models.load_model(path)
        c.same("a saved model loads without Horo, with the plain optimizer", type(plain.optimizer),
               keras.optimizers.Adam)
        loaded = hvd.load_model(path, legacy_opts=False)
        try:
            hvd.load_model(path, legacy_opts=True)
            refused = None
        except ValueError as e:
            refused = str(e)
        c.same("load_model(legacy_opts=True) is refused: Keras 3 has no legacy optimizers",
               refused is not None and "legacy_opts" in refused, True)
        h5 = os.path.join(tmp, f"model-rank{r}.h5")
        model.save(h5)
        from_h5 = hvd.load_model(h5)
        c.same("load_model of a legacy .h5 file wraps the optimizer too (its loader lower-cases the name)",
               (isinstance(from_h5.optimizer, keras.optimizers.Adam),
                "DistributedMixin" in str(type(from_h5.optimizer).__mro__)), (True, True))
        for i, (a, b) in enumerate(zip(from_h5.get_weights(), model.get_weights())):
            c.equal(f"load_model .h5 weights {i}", a, b)
        # Keras 3's own .h5 loader builds the optimizer on no variables: no state, and "Unknown
        # variable" at the first step.
        c.same("load_model of a legacy .h5 file restores the optimizer's variables",
               (len(from_h5.optimizer.variables), int(from_h5.optimizer.iterations.numpy())),
               (len(model.optimizer.variables), int(model.optimizer.iterations.numpy())))
        for i, (a, b) in enumerate(zip(from_h5.optimizer.variables, model.optimizer.variables)):
            c.equal(f"load_model .h5 optimizer variable {i}", a, b)
        from_h5.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

        untrained = make_model(keras, 102)
        untrained.compile(optimizer=keras.optimizers.Adam(0.01), loss="mean_squared_error")
        path = os.path.join(tmp, f"untrained-rank{r}.h5")
        untrained.save(path)
        resumed = hvd.load_model(path)
        resumed.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        c.same("a legacy .h5 file saved before any training loads and trains, distributed",
               ("DistributedMixin" in str(type(resumed.optimizer).__mro__), int(resumed.optimizer.iterations.numpy())),
               (True, STEPS))

        @keras.saving.register_keras_serializable(package="horo_test")
        class CustomAdam(keras.optimizers.Adam):
            pass

        custom = make_model(keras, 101)
        custom.compile(optimizer=hvd.DistributedOptimizer(CustomAdam(0.01)), loss="mean_squared_error")
        custom.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        path = os.path.join(tmp, f"custom-rank{r}.keras")
        custom.save(path)
        c.same("a model trained with a registered optimizer class loads without Horo, as that class",
               type(keras.models.load_model(path).optimizer), CustomAdam)
        again = hvd.load_model(path).optimizer
        c.same("and load_model wraps it without custom_optimizers",
               (isinstance(again, CustomAdam), "DistributedMixin" in str(type(again).__mro__)), (True, True))
        scaled = make_model(keras, 103)
        scaled.compile(optimizer=keras.optimizers.LossScaleOptimizer(CustomAdam(0.01)), loss="mean_squared_error")
        scaled.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        path = os.path.join(tmp, f"scaled-rank{r}.keras")
        scaled.save(path)
        again = hvd.load_model(path, custom_optimizers=[CustomAdam]).optimizer
        c.same("a LossScaleOptimizer written without Horo: its inner optimizer alone becomes distributed",
               (isinstance(again, hvd._DistributedMixin), isinstance(again.inner_optimizer, hvd._DistributedMixin),
                isinstance(again.inner_optimizer, CustomAdam)), (False, True, True))
    opt = loaded.optimizer
    c.same("load_model wraps the optimizer", (isinstance(opt, keras.optimizers.Adam),
                                               "DistributedMixin" in str(type(opt).__mro__)), (True, True))
    c.same("load_model restores the optimizer state", int(opt.iterations.numpy()),
           int(model.optimizer.iterations.numpy()))
    for i, (a, b) in enumerate(zip(loaded.get_weights(), model.get_weights())):
        c.equal(f"load_model weights {i}", a, b)
    loaded.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    weights = loaded.get_weights()
    root = [hvd.broadcast(w, 0, name=f"loaded.{i}") for i, w in enumerate(weights)]
    for i, (a, b) in enumerate(zip(weights, root)):
        c.equal(f"training continues in step after load_model {i}", a, b)
    for i, (a, b) in enumerate(zip(from_h5.get_weights(), weights)):
        c.equal(f"training resumed from the .h5 file as from the .keras one {i}", a, b)


def check_resume_on_rank_0_only(c, hvd, keras, tf):
    """Horovod's resume pattern (keras_imagenet_resnet50.py): rank 0 restores the checkpoint with
    load_model, its optimizer built and stepped, while the others build a fresh model. Its gradients
    must meet theirs under the same names, and the broadcast callback must not compare variable
    lists that differ by rank (it broadcasts everything after the first batch then). The same for
    a model that rank 0 alone built before fit (to print its summary)."""
    import os
    import shutil
    import tempfile

    import horo_tf
    n, r = hvd.size(), hvd.rank()
    (xs, ys), (xg, yg), global_batch = shard_and_global(n, r)

    def build(seed, wrap=hvd.DistributedOptimizer):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((xs.shape[1],)), keras.layers.Dense(6, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=wrap(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
        return model

    def agree(what, model):
        state = model.get_weights() + [v.numpy() for v in model.optimizer.variables]
        everyone = horo_tf.allgather_object([len(state)] + [w.tolist() for w in state], name=f"resume.{what}")
        c.same(f"{what}: every rank holds root_rank's weights and optimizer state",
               all(e == everyone[0] for e in everyone), True)

    tmp = horo_tf.broadcast_object(tempfile.mkdtemp() if r == 0 else None, 0, name="resume.dir")
    try:
        path = os.path.join(tmp, "checkpoint.keras")
        if r == 0:
            first = build(500, wrap=lambda optimizer: optimizer)  # an earlier run's checkpoint
            first.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
            first.save(path)
        hvd.allreduce(tf.zeros([1]), name="resume.saved")
        model = hvd.load_model(path) if r == 0 else build(600 + r)
        c.same("rank 0 alone has optimizer variables before fit", model.optimizer.built, r == 0)
        if r == 0:
            c.same("load_model wraps the optimizer of a checkpoint written without Horo, its state kept",
                   ("DistributedMixin" in str(type(model.optimizer).__mro__), int(model.optimizer.iterations.numpy())),
                   (True, int(first.optimizer.iterations.numpy())))
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        agree("resumed on rank 0 only", model)
        # And it is the run that one process resuming from the checkpoint makes on the global batch:
        # the model's weights are broadcast before the first step (the optimizers, which differ,
        # after it), so the first step's gradients are taken at the checkpoint's weights everywhere.
        reference = keras.models.load_model(path)
        reference.fit(xg, yg, batch_size=global_batch, epochs=1, shuffle=False, verbose=0)
        for i, (a, b) in enumerate(zip(model.get_weights(), reference.get_weights())):
            c.close(f"resumed on rank 0 only: weight {i} as one process resuming", a, b)

        # The same with an optimizer named in DistributedOptimizer(name=...): the name is saved with
        # the model, and the restored optimizer's reductions carry it as the built ones' do. Options
        # beyond compression (here op=Sum) reach load_model as keyword arguments.
        def named(optimizer):
            return hvd.DistributedOptimizer(optimizer, name="resumable", op=hvd.Sum)

        if r == 0:  # compiled, not trained: rank 0 alone cannot train with a DistributedOptimizer
            build(510, wrap=named).save(path)
        hvd.allreduce(tf.zeros([1]), name="resume.saved.named")
        model = hvd.load_model(path, op=hvd.Sum) if r == 0 else build(610 + r, wrap=named)
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        agree("resumed on rank 0 only, the optimizer named", model)

        # DistributedOptimizer(LossScaleOptimizer(opt)): Keras loads the file's optimizer the other
        # way round, whose reductions the building ranks never submit. load_model keeps the nesting.
        def scaled(optimizer):
            return hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=64.0))

        if r == 0:
            build(520, wrap=scaled).save(path)
        hvd.allreduce(tf.zeros([1]), name="resume.saved.scaled")
        model = hvd.load_model(path) if r == 0 else build(620 + r, wrap=scaled)
        c.same("load_model keeps DistributedOptimizer(LossScaleOptimizer(opt))",
               (isinstance(model.optimizer, hvd._DistributedMixin),
                isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer),
                isinstance(model.optimizer.inner_optimizer, hvd._DistributedMixin)), (True, True, False))
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        agree("resumed on rank 0 only, the loss scaling inside", model)
    finally:
        if r == 0:
            shutil.rmtree(tmp, ignore_errors=True)

    keras.utils.set_random_seed(700 + r)
    model = keras.Sequential([keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    if r == 0:
        model.predict(xs[:2], verbose=0)  # builds the model here only
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    agree("built on rank 0 only", model)


def check_names_alike_whatever_else_a_rank_built(c, hvd, keras, tf):
    """Keras numbers optimizer names per process (adam, adam_1, ...): a rank that built another
    optimizer first still reduces its gradients under the names its peers use, instead of waiting
    for a name no peer submits."""
    import horo_tf
    n, r = hvd.size(), hvd.rank()
    (xs, ys), _, _ = shard_and_global(n, r)
    if r == 0:
        keras.optimizers.Adam(0.01)  # as a rank that loads a compiled model first would
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    names = horo_tf.allgather_object(opt.name, name="optimizer-names")
    c.same("Keras named the optimizers differently on the ranks", len(set(names)), n)
    model = make_model(keras, 100 + r)
    model.compile(optimizer=opt, loss="mse")
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    weights = model.get_weights()
    root = [hvd.broadcast(w, 0, name=f"named-alike.{i}") for i, w in enumerate(weights)]
    for i, (a, b) in enumerate(zip(weights, root)):
        c.equal(f"fit with optimizers named differently on the ranks: weights {i} agree", a, b)
    c.same("horo_tf.keras exports Adasum, as horovod.keras does", hvd.Adasum, horo_tf.Adasum)


def check_models_that_differ_between_ranks(c, hvd, keras, tf):
    """Ranks whose models differ get the core's mismatch at their first step, every one of them,
    instead of each waiting for reductions named after its own variables' shapes."""
    r = hvd.rank()
    x, y = np.ones((4 * BATCH, 4), np.float32), np.ones((4 * BATCH, 1), np.float32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3 + 2 * (r % 2)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    c.raises("fit of models whose first layer differs between the ranks", [tf.errors.OpError],
             "Mismatched shapes for allreduce tensor 'grouped_allreduce.DistributedOptimizer.SGD.0.0.0': rank 0 has "
             "[4, 3], rank 1 has [4, 5]", lambda: model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0))


def TapeStepModel(keras, tf, horo_tf):
    """A model whose own train_step reduces its gradients with DistributedGradientTape."""

    class TapeStep(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            grads = horo_tf.DistributedGradientTape(tape).gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    return TapeStep()


def check_xla_and_functions(c, hvd, keras, tf):
    n, r = hvd.size(), hvd.rank()
    (xs, ys), _, _ = shard_and_global(n, r)
    model = make_model(keras, 100)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    c.raises("fit under XLA is refused", [Exception], "jit_compile=False",
             lambda: model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0))

    # Keras 3 resolves jit_compile="auto" to XLA when TensorFlow sees a GPU; with a Horo optimizer
    # (also inside a LossScaleOptimizer), or a train_step of the model's own (Horovod's TF2 pattern
    # runs a DistributedGradientTape there), it must resolve to False, so that Horovod's compile()
    # call trains on a GPU machine. A GPU is made visible to the resolution only.
    real = tf.config.list_physical_devices
    tf.config.list_physical_devices = lambda *a: real(*a) + [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
    try:
        resolved = {}
        for what, make_opt in (("plain", lambda: keras.optimizers.SGD(0.1)),
                               ("horo", lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))),
                               ("loss-scaled horo", lambda: keras.optimizers.LossScaleOptimizer(
                                   hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))))):
            candidate = make_model(keras, 100)
            candidate.compile(optimizer=make_opt(), loss="mse")
            resolved[what] = candidate.jit_compile
        # SyncBatchNormalization's statistics travel outside XLA too, whatever the optimizer.
        import horo_tf
        candidate = keras.Sequential([keras.Input((FEATURES,)), horo_tf.SyncBatchNormalization(),
                                      keras.layers.Dense(1)])
        candidate.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        resolved["plain, SyncBatchNormalization"] = candidate.jit_compile
        candidate = TapeStepModel(keras, tf, horo_tf)
        candidate.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        resolved["plain, own train_step"] = candidate.jit_compile
    finally:
        tf.config.list_physical_devices = real
    c.same("jit_compile='auto' with a visible GPU: XLA for a plain optimizer, not for Horo's", resolved,
           {"plain": True, "horo": False, "loss-scaled horo": False, "plain, SyncBatchNormalization": False,
            "plain, own train_step": False})
    # And that model trains with "auto" (no GPU here: XLA stays off anyway, so this checks the step).
    candidate.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
    model = make_model(keras, 100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    c.equal("keras allreduce", hvd.allreduce(np.array([r, 1.0]), op=hvd.Sum), [sum(range(n)), n])
    c.equal("keras allgather", hvd.allgather(np.array([[r]])), [[s] for s in range(n)])
    c.equal("keras broadcast", hvd.broadcast(np.array([r]), 1), [1])
    c.equal("keras reducescatter", hvd.reducescatter(np.ones([n, 2]), op=hvd.Sum), [[n, n]])
    # Horovod's Keras functions return the collective's tensor when executing eagerly (.numpy() works).
    c.same("keras functions return tensors, as Horovod's",
           [type(hvd.allreduce(np.ones(1))).__name__, hvd.broadcast(np.array([r]), 0).numpy().tolist()],
           ["EagerTensor", [0]])
    c.raises("DistributedOptimizer needs a Keras optimizer", [ValueError], "keras.optimizers.Optimizer",
             lambda: hvd.DistributedOptimizer(object()))
    import horo_tf
    c.same("horo_tf and horo_tf.keras export the timeline API",
           (horo_tf.start_timeline, horo_tf.stop_timeline), (hvd.start_timeline, hvd.stop_timeline))
    c.raises("start_timeline needs HORO_TIMELINE, as in Horovod", [ValueError], "HORO_TIMELINE=DYNAMIC",
             lambda: hvd.start_timeline("timeline.json"))


def check_mixed_precision(c, hvd, keras, tf):
    """mixed_float16 with DistributedOptimizer(LossScaleOptimizer(opt)), and with the other order
    that model.compile builds from a plain DistributedOptimizer, matches one process on the
    concatenated batches; a non-finite gradient on rank 1 alone makes every rank skip that step."""
    n, r = hvd.size(), hvd.rank()
    # Well below Keras's 2**15: a rank's gradients are n times the global batch's in float16, and
    # must not overflow where the reference's do not.
    SCALE = 2.0 ** 8
    orders = {
        "DistributedOptimizer(LossScaleOptimizer)": lambda: hvd.DistributedOptimizer(
            keras.optimizers.LossScaleOptimizer(OPTIMIZERS["SGD momentum"](keras), initial_scale=SCALE)),
        # What compile builds from hvd.DistributedOptimizer(opt), with the scale set.
        "LossScaleOptimizer(DistributedOptimizer)": lambda: keras.optimizers.LossScaleOptimizer(
            hvd.DistributedOptimizer(OPTIMIZERS["SGD momentum"](keras)), initial_scale=SCALE),
    }
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        for (order, make_optimizer), inf_step in itertools.product(orders.items(), (None, 1)):
            (xs, ys), (xg, yg), global_batch = shard_and_global(n, r)
            what = order + (": clean" if inf_step is None else f": inf on rank 1 in batch {inf_step}")
            if inf_step is not None:
                rows = slice(inf_step * BATCH, (inf_step + 1) * BATCH)
                xg[inf_step * global_batch + BATCH:(inf_step + 1) * global_batch] = np.inf  # rank 1's rows
                if r == 1:
                    xs[rows] = np.inf
            dist = make_model(keras, seed=100)
            dist.compile(optimizer=make_optimizer(), loss="mse")
            dist.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
            ref = make_model(keras, seed=100)
            ref.compile(optimizer=keras.optimizers.LossScaleOptimizer(OPTIMIZERS["SGD momentum"](keras),
                                                                      initial_scale=SCALE), loss="mse")
            ref.fit(xg, yg, batch_size=global_batch, epochs=2, shuffle=False, verbose=0)
            c.same(f"{what}: compile does not wrap a LossScaleOptimizer again",
                   isinstance(dist.optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer), False)
            skipped = 0 if inf_step is None else 2  # the bad batch comes once per epoch
            c.same(f"{what}: iterations count the applied steps", int(dist.optimizer.iterations.numpy()),
                   2 * STEPS - skipped)
            scales = hvd.allgather(np.array([float(dist.optimizer.dynamic_scale.numpy())]), name=f"scale.{what}")
            c.equal(f"{what}: every rank has the reference's loss scale", scales,
                    [float(ref.optimizer.dynamic_scale.numpy())] * n)
            c.same(f"{what}: the scale halves once per skipped step", float(scales[0]), SCALE / 2 ** skipped)
            for i, (a, b) in enumerate(zip(dist.get_weights(), ref.get_weights())):
                c.close(f"{what}: weight {i} matches one process", a, b, rtol=2e-3, atol=2e-4)
                c.equal(f"{what}: weight {i} identical on every rank", a, hvd.broadcast(a, 0, name=f"w.{what}.{i}"))
        # Horovod's script as written: compile wraps the DistributedOptimizer itself; then resumed
        # with load_model from either format, with the gradients reduced once.
        import os
        import tempfile
        (xs, ys), _, _ = shard_and_global(n, r)
        model = make_model(keras, seed=100)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                      loss=keras.losses.MeanSquaredError())
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        c.same("compile wraps a DistributedOptimizer in a LossScaleOptimizer",
               type(model.optimizer), keras.optimizers.LossScaleOptimizer)
        model.optimizer.dynamic_scale.assign(1024.0)  # not the initial scale: proves it is restored
        with tempfile.TemporaryDirectory() as tmp:
            for ext in ("keras", "h5"):
                path = os.path.join(tmp, f"mixed-rank{r}.{ext}")
                model.save(path)
                loaded = hvd.load_model(path)
                outer, inner = loaded.optimizer, loaded.optimizer.inner_optimizer
                c.same(f"load_model .{ext} under mixed_float16: one of the two optimizers is distributed",
                       [isinstance(o, hvd._DistributedMixin) for o in (outer, inner)].count(True), 1)
                c.same(f"load_model .{ext} under mixed_float16: the loss scale is restored",
                       float(outer.dynamic_scale.numpy()), 1024.0)
                loaded.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
                for i, a in enumerate(loaded.get_weights()):
                    c.equal(f"resumed from .{ext} under mixed_float16: weight {i} identical on every rank", a,
                            hvd.broadcast(a, 0, name=f"w.resumed.{ext}.{i}"))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def check_sync_batch_norm_fit(c, hvd, keras, tf):
    """model.fit with SyncBatchNormalization on every rank's batch equals one process fitting plain
    BatchNormalization on their concatenation: equal batches (mean loss, Average), and uneven
    batches (summed loss, Sum, so that every sample weighs the same)."""
    import horo_tf
    n, r = hvd.size(), hvd.rank()

    def model(norm):
        keras.utils.set_random_seed(100)
        return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(6), norm(momentum=0.8),
                                 keras.layers.Activation("tanh"), keras.layers.Dense(1)])

    x, y = data(n)
    for label, rows, op, loss in (("equal batches", [BATCH] * n, hvd.Average, "mse"),
                                  ("uneven batches", [2 + 3 * s for s in range(n)], hvd.Sum,
                                   keras.losses.MeanSquaredError(reduction="sum"))):
        per_step = sum(rows)
        # Step k takes rows[s] consecutive rows of x for rank s, in rank order.
        steps = len(x) // per_step
        mine = np.concatenate([np.arange(k * per_step + sum(rows[:r]), k * per_step + sum(rows[:r + 1]))
                               for k in range(steps)])
        dist, ref = model(horo_tf.SyncBatchNormalization), model(keras.layers.BatchNormalization)
        ref.set_weights(dist.get_weights())
        dist.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS["SGD momentum"](keras), op=op), loss=loss)
        dist.fit(x[mine], y[mine], batch_size=rows[r], epochs=2, shuffle=False, verbose=0)
        ref.compile(optimizer=OPTIMIZERS["SGD momentum"](keras), loss=loss)
        ref.fit(x[:steps * per_step], y[:steps * per_step], batch_size=per_step, epochs=2, shuffle=False, verbose=0)
        # get_weights lists the moving mean and variance too.
        for i, (a, b) in enumerate(zip(dist.get_weights(), ref.get_weights())):
            c.close(f"SyncBatchNormalization fit, {label}: weight {i}", a, b, rtol=1e-4, atol=1e-5)
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"sync-bn-rank{r}.keras")
        dist.save(path)
        loaded = keras.models.load_model(path)  # registered: no custom_objects needed
    c.same("a saved SyncBatchNormalization loads as itself", type(loaded.layers[1]), horo_tf.SyncBatchNormalization)
    for i, (a, b) in enumerate(zip(loaded.get_weights(), dist.get_weights())):
        c.equal(f"the loaded SyncBatchNormalization model's weight {i}", a, b)


class _GradientTypes:
    """A Keras optimizer class factory whose apply records the gradient types it is given, and
    densifies IndexedSlices first if asked (Keras's Adam updates its moments lazily for
    IndexedSlices, so a sparse_as_dense run must be compared with dense gradients)."""

    @staticmethod
    def make(keras, tf, base, seen, densify=False):
        class Recording(base):
            def apply(self, grads, trainable_variables=None):
                seen.append([type(g).__name__ for g in grads])
                if densify:
                    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
                return super().apply(grads, trainable_variables)
        return Recording


def check_sparse_embedding_fit(c, hvd, keras, tf):
    """Keras 3 hands the optimizer an Embedding's gradient as IndexedSlices; the DistributedOptimizer
    allgathers them (or densifies them with sparse_as_dense) and fit equals one process on the
    concatenated batches."""
    n, r = hvd.size(), hvd.rank()
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 12, size=(n * BATCH * STEPS, 3)).astype(np.int32)
    target = rng.normal(size=(len(ids), 1)).astype(np.float32)
    shards = [np.arange(len(ids))[s::n] for s in range(n)]
    order = np.concatenate([np.concatenate([shards[s][k:k + BATCH] for s in range(n)])
                            for k in range(0, len(shards[0]), BATCH)])

    def model():
        keras.utils.set_random_seed(100)
        return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(12, 4),
                                 keras.layers.Flatten(), keras.layers.Dense(1)])

    for sparse_as_dense, name in ((False, "SGD momentum"), (False, "Adam"), (True, "Adam")):
        seen, ref_seen = [], []
        optimizer = OPTIMIZERS[name](keras)
        dist_opt = _GradientTypes.make(keras, tf, type(optimizer), seen).from_config(optimizer.get_config())
        ref_opt = _GradientTypes.make(keras, tf, type(optimizer), ref_seen,
                                      densify=sparse_as_dense).from_config(optimizer.get_config())
        dist, ref = model(), model()
        dist.compile(optimizer=hvd.DistributedOptimizer(dist_opt, sparse_as_dense=sparse_as_dense), loss="mse")
        dist.fit(ids[shards[r]], target[shards[r]], batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        ref.compile(optimizer=ref_opt, loss="mse")
        ref.fit(ids[order], target[order], batch_size=n * BATCH, epochs=2, shuffle=False, verbose=0)
        what = f"Embedding fit {name} sparse_as_dense={sparse_as_dense}"
        c.same(f"{what}: Keras computes the embedding gradient as IndexedSlices", ref_seen[0][0], "IndexedSlices")
        c.same(f"{what}: the reduced embedding gradient type", seen[0][0] == "IndexedSlices", not sparse_as_dense)
        for i, (a, b) in enumerate(zip(dist.get_weights(), ref.get_weights())):
            c.close(f"{what}: weight {i}", a, b)


def check_local_variables(c, hvd, keras, tf):
    """register_local_var and PartialDistributedOptimizer: a local variable's gradient is this rank's
    own (divided by size unless scale_local_gradients=False); the others are averaged."""
    n, r = hvd.size(), hvd.rank()
    mean = (n + 1) / 2
    for scale in (True, False):
        for passes in (1, 2):
            shared, local = keras.Variable([1.0]), keras.Variable([2.0])
            opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), scale_local_gradients=scale,
                                           backward_passes_per_step=passes)
            opt.register_local_var(local)
            for _ in range(passes):
                opt.apply([tf.constant([float(r + 1)]), tf.constant([10.0 * (r + 1)])], [shared, local])
            what = f"scale_local_gradients={scale} backward_passes_per_step={passes}"
            c.close(f"{what}: shared variable takes the averaged gradient", shared.numpy(), [1.0 - passes * mean])
            own = passes * 10.0 * (r + 1)
            c.close(f"{what}: local variable takes this rank's gradient", local.numpy(),
                    [2.0 - (own / n if scale else own)])

    (xs, ys), _, _ = shard_and_global(n, r)
    keras.utils.set_random_seed(500)
    head = keras.layers.Dense(1, name="local_head")
    model = keras.Sequential([keras.Input((xs.shape[1],)), keras.layers.Dense(4, name="shared_body"), head])
    plain_variables = len(keras.optimizers.SGD(0.05).variables)
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.05), local_layers=head)
    model.compile(optimizer=opt, loss="mse")
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    import horo_tf
    weights = horo_tf.allgather_object([w.tolist() for w in model.get_weights()])
    c.same("PartialDistributedOptimizer: the shared layer agrees across ranks",
           all(w[:2] == weights[0][:2] for w in weights), True)
    c.same("PartialDistributedOptimizer: the local layer differs between ranks",
           len({str(w[2:]) for w in weights}), n)
    c.same("local variables add no optimizer state", len(keras.optimizers.SGD(0.05).variables), plain_variables)
    c.raises("PartialDistributedOptimizer: local_layers must be layers", [ValueError], "keras.layers.Layer",
             lambda: hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.05), local_layers=[model.weights[0]]))


GROUPS = [check_fit_equivalence, check_gradient_accumulation, check_custom_loop, check_callbacks,
          check_broadcast_of_models_built_by_their_first_step,
          check_checkpoint_and_load, check_resume_on_rank_0_only, check_names_alike_whatever_else_a_rank_built,
          check_models_that_differ_between_ranks,
          check_xla_and_functions, check_mixed_precision, check_sync_batch_norm_fit,
          check_sparse_embedding_fit, check_local_variables]


def run_all_checks():
    import keras
    import tensorflow as tf

    import horo_tf.keras as hvd
    tf.get_logger().setLevel("ERROR")
    hvd.init()
    report = run_groups(GROUPS, hvd, keras, tf)
    hvd.shutdown()
    return report


def test_tf_keras():
    reports = horo_runner.run(run_all_checks, num_proc=2, env=CHILD_ENV)
    assert_reports(reports, 2, GROUPS)


def test_the_optimizer_refuses_a_keras_on_another_backend(child_env):
    # Under KERAS_BACKEND=torch the optimizer's gradients are torch tensors; the TensorFlow
    # reduction handed back TensorFlow tensors, and fit failed deep in torch (on 2 ranks only).
    code = "import keras, horo_tf.keras as hvd; hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))"
    env = {**child_env, **CHILD_ENV, "KERAS_BACKEND": "torch"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert ("HoroInvalidArgument: horo_tf.keras's DistributedOptimizer reduces gradients with TensorFlow, but Keras "
            "runs on its 'torch' backend (KERAS_BACKEND); set KERAS_BACKEND=tensorflow") in done.stderr, done.stderr
