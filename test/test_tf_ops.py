"""horo_tf's collectives, gradients, tapes, join, SyncBatchNormalization and object helpers: real
processes over TCP, 2 and 3 ranks.

One ``horo_runner.run`` per world size runs every group of checks on every rank, eagerly and inside
``tf.function``. A rank contributes values derived from its rank, so every expected value is exact.
"""
import warnings

import numpy as np
import pytest

import horo_runner
from tf_checks import CHILD_ENV, assert_reports, run_groups

SIZES = [2, 3]


def contribution(rank, shape, dtype):
    import tensorflow as tf
    i = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return tf.constant((rank + 1.0) * (1 + i % 3), dtype=dtype)


def expected_reduce(op, ranks, shape):
    stack = np.stack([(r + 1.0) * (1 + np.arange(int(np.prod(shape))).reshape(shape) % 3) for r in ranks])
    return {"Sum": stack.sum(0), "Average": stack.sum(0) / len(ranks), "Min": stack.min(0),
            "Max": stack.max(0)}[op]


def both_modes(fn):
    """fn run eagerly and as a tf.function: [("eager", result), ("graph", result)]."""
    import tensorflow as tf
    return [("eager", fn()), ("graph", tf.function(fn)())]


def check_topology(c, hvd, tf, env):
    n, r = hvd.size(), hvd.rank()
    c.same("rank", r, int(env["HORO_RANK"]))
    c.same("size", n, int(env["HORO_SIZE"]))

    @tf.function
    def ops():
        return hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op(), hvd.process_set_included_op()

    got = [int(t.numpy()) for t in ops()]
    c.same("topology ops in tf.function", got, [r, n, hvd.local_rank(), hvd.local_size(), 1])
    c.equal("rank_op eager", hvd.rank_op(), r)


def check_allreduce(c, hvd, tf, env):
    n, r = hvd.size(), hvd.rank()
    ranks = list(range(n))
    for dtype in (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.uint8, tf.uint16):
        for op in ("Sum", "Min", "Max") + (("Average",) if dtype.is_floating else ()):
            x = contribution(r, (2, 3), dtype)
            for mode, got in both_modes(lambda: hvd.allreduce(x, op=getattr(hvd, op))):
                c.equal(f"allreduce {op} {dtype.name} {mode}", got, expected_reduce(op, ranks, (2, 3)), dtype)
    v = tf.Variable(contribution(r, (4,), tf.float32))
    c.equal("allreduce of a variable", hvd.allreduce(v, op=hvd.Sum), expected_reduce("Sum", ranks, (4,)))
    c.equal("allreduce empty", hvd.allreduce(tf.zeros([0, 2])), np.zeros([0, 2]))
    c.equal("allreduce scalar", hvd.allreduce(tf.constant(float(r)), op=hvd.Sum), sum(ranks))
    # Adasum: orthogonal contributions add up, equal ones average.
    basis = np.zeros(n, np.float32)
    basis[r] = r + 1.0
    for mode, got in both_modes(lambda: hvd.allreduce(tf.constant(basis), op=hvd.Adasum)):
        c.equal(f"Adasum of orthogonal vectors {mode}", got, np.arange(1.0, n + 1))
    c.equal("Adasum of equal vectors", hvd.allreduce(tf.fill([3], 2.0), op=hvd.Adasum), [2.0, 2.0, 2.0])
    scaled = hvd.allreduce(contribution(r, (3,), tf.float64), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    c.equal("allreduce scales", scaled, expected_reduce("Sum", ranks, (3,)))
    for comp in (hvd.Compression.fp16, hvd.Compression.bf16):
        got = hvd.allreduce(contribution(r, (5,), tf.float32), op=hvd.Sum, compression=comp)
        c.equal(f"allreduce {comp.__name__}", got, expected_reduce("Sum", ranks, (5,)), tf.float32)
    ints = [tf.constant([r], tf.int32), contribution(r, (2,), tf.float32)]
    for mode, got in both_modes(lambda: hvd.grouped_allreduce(ints, op=hvd.Sum)):
        c.equal(f"grouped_allreduce int {mode}", got[0], [sum(ranks)])
        c.equal(f"grouped_allreduce float {mode}", got[1], expected_reduce("Sum", ranks, (2,)))

    def named_in_scope():
        with tf.name_scope("outer"):
            return hvd.allreduce(tf.constant([1.0]), name="scoped", op=hvd.Sum)

    for mode, got in both_modes(named_in_scope):
        c.equal(f"named allreduce in a name scope {mode}", got, [float(n)])


def check_indexed_slices(c, hvd, tf, env):
    n, r = hvd.size(), hvd.rank()
    slices = tf.IndexedSlices(tf.fill([r + 1, 2], float(r + 1)), tf.fill([r + 1], r), tf.constant([n, 2]))
    values = np.concatenate([np.full([s + 1, 2], float(s + 1)) for s in range(n)])
    indices = np.concatenate([np.full([s + 1], s) for s in range(n)])
    for mode, got in both_modes(lambda: hvd.allreduce(slices, op=hvd.Average)):
        c.same(f"IndexedSlices stays IndexedSlices {mode}", type(got).__name__, "IndexedSlices")
        c.equal(f"IndexedSlices Average values {mode}", got.values, values / n)
        c.equal(f"IndexedSlices indices {mode}", got.indices, indices)
        c.equal(f"IndexedSlices dense result {mode}", tf.convert_to_tensor(got),
                np.stack([np.full(2, (s + 1.0) ** 2 / n) for s in range(n)]))
    mixed = hvd.grouped_allreduce([slices, tf.constant([float(r)])], op=hvd.Sum)
    c.equal("grouped mixed sparse values", mixed[0].values, values)
    c.equal("grouped mixed dense", mixed[1], [float(sum(range(n)))])
    # Compression applies to dense tensors only, as in Horovod: 70000 would overflow float16.
    big = tf.IndexedSlices(tf.constant([[1.0001, 70000.0]]), tf.constant([r]), tf.constant([n, 2]))
    compressed = hvd.grouped_allreduce([big, tf.constant([1.0001])], op=hvd.Sum, compression=hvd.Compression.fp16)
    c.equal("fp16 compression leaves IndexedSlices values as they are", compressed[0].values,
            np.array([[1.0001, 70000.0]] * n, dtype=np.float32))
    c.same("fp16 compression applies to the dense member", float(compressed[1].numpy()[0]),
           float(np.float16(1.0001)) * n)
    c.raises("IndexedSlices with Max", [NotImplementedError, hvd.HoroError], "sparse_as_dense",
             lambda: hvd.allreduce(slices, op=hvd.Max))
    # Refused before the dense members move: the dense member's shape differs between the ranks, so
    # reducing it first would fail with a mismatch instead.
    uneven = tf.ones([r + 1])
    c.raises("grouped IndexedSlices and dense with Max", [NotImplementedError], "sparse_as_dense",
             lambda: hvd.grouped_allreduce([slices, uneven], op=hvd.Max))
    # Integer values: Horovod's true division (3 and 5 averaged over 2 ranks are 1.5 and 2.5, not 0).
    ints = tf.IndexedSlices(tf.fill([r + 1, 2], r + 1), tf.fill([r + 1], r), tf.constant([n, 2]))
    for mode, got in both_modes(lambda: hvd.allreduce(ints, op=hvd.Average)):
        c.equal(f"integer IndexedSlices Average values {mode}", got.values,
                np.concatenate([np.full([s + 1, 2], (s + 1) / n) for s in range(n)]))
    c.raises("integer IndexedSlices with a fractional scale", [NotImplementedError], "cannot be scaled",
             lambda: hvd.allreduce(ints, op=hvd.Sum, prescale_factor=0.5))
    c.raises("grouped integer IndexedSlices with a scale, refused before the dense member", [NotImplementedError],
             "cannot be scaled", lambda: hvd.grouped_allreduce([ints, uneven], op=hvd.Sum, prescale_factor=0.5))


def check_allgather_broadcast(c, hvd, tf, env):
    n, r = hvd.size(), hvd.rank()
    x = tf.fill([r + 1, 2], r)
    want = np.concatenate([np.full([s + 1, 2], s) for s in range(n)])
    for mode, got in both_modes(lambda: hvd.allgather(x)):
        c.equal(f"allgather uneven {mode}", got, want, tf.int32)
    got = hvd.grouped_allgather([x, tf.constant([float(r)])])
    c.equal("grouped_allgather 0", got[0], want)
    c.equal("grouped_allgather 1", got[1], [float(s) for s in range(n)])
    root = n - 1
    for mode, got in both_modes(lambda: hvd.broadcast(contribution(r, (3,), tf.float32), root)):
        c.equal(f"broadcast {mode}", got, contribution(root, (3,), tf.float32))
    # uint16 (which Horovod's allgather and broadcast take): values above int16's range stay as they are.
    big = tf.constant([60000 - r, r], tf.uint16)
    for mode, got in both_modes(lambda: hvd.allgather(tf.reshape(big, (1, 2)))):
        c.equal(f"allgather uint16 {mode}", got, [[60000 - s, s] for s in range(n)], tf.uint16)
    for mode, got in both_modes(lambda: hvd.broadcast(big, root)):
        c.equal(f"broadcast uint16 {mode}", got, [60000 - root, root], tf.uint16)
    variables = [tf.Variable(contribution(r, (2,), tf.float32)), tf.Variable(tf.constant([r, r], tf.int64))]
    values = hvd.broadcast_(variables, root)
    c.equal("broadcast_ float variable", variables[0], contribution(root, (2,), tf.float32))
    c.equal("broadcast_ int variable", variables[1], [root, root])
    # As Horovod's: a list of the new values as tensors.
    c.same("broadcast_ returns tensors", [type(values).__name__] + [isinstance(v, tf.Tensor) for v in values],
           ["list", True, True])
    c.equal("broadcast_ returns the new values", values[1], [root, root])
    variables = [tf.Variable(float(r)), tf.Variable([r, r + 1])]
    hvd.broadcast_variables(variables, root_rank=0)
    c.same("broadcast_variables", [float(variables[0].numpy()), variables[1].numpy().tolist()], [0.0, [0, 1]])
    # A list of one is a group too: against a longer list it named a tensor no other rank submitted.
    c.raises("broadcast_variables of one variable against two", [tf.errors.FailedPreconditionError],
             "Mismatched grouped calls", lambda: hvd.broadcast_variables(variables[:1 if r == n - 1 else 2], 0))
    c.same("broadcast_object", hvd.broadcast_object({"rank": r, "list": [r] * (r + 1)}, root_rank=root),
           {"rank": root, "list": [root] * (root + 1)})
    c.same("allgather_object", hvd.allgather_object(("r", r) * (r + 1)), [("r", s) * (s + 1) for s in range(n)])
    # An object only the last rank cannot pickle: every rank fails, and the next calls still pair up.
    import threading
    last = n - 1
    expected = ([hvd.HoroInvalidArgument], f"rank {last} could not serialise its object (TypeError: cannot pickle")
    c.raises("broadcast_object of a lock", *expected,
             lambda: hvd.broadcast_object(threading.Lock() if r == last else None, root_rank=last))
    c.raises("allgather_object of a lock", *expected,
             lambda: hvd.allgather_object(threading.Lock() if r == last else r))
    c.same("broadcast_object after a lock", hvd.broadcast_object(f"from {r}", root_rank=last), f"from {last}")
    c.same("allgather_object after a lock", hvd.allgather_object(r), list(range(n)))
    c.raises("allgather of a scalar", [ValueError], "rank >= 1", lambda: hvd.allgather(tf.constant(1.0)))


def check_alltoall_reducescatter(c, hvd, tf, env):
    n, r = hvd.size(), hvd.rank()
    # Fractional splits are refused, not truncated, eagerly and in a tf.function.
    fractional = [1.5] + [1.0] * (n - 1)
    c.raises("alltoall with fractional splits", [ValueError], "alltoall splits must be whole numbers",
             lambda: hvd.alltoall(tf.ones([n + 1]), splits=fractional))
    c.raises("alltoall with a float splits tensor in a tf.function", [ValueError],
             "alltoall splits must be integers, got a tensor of dtype float32",
             lambda: tf.function(lambda x, s: hvd.alltoall(x, splits=s))(tf.ones([n + 1]), tf.constant(fractional)))
    # Splits given as a list of tensors inside a tf.function, as Horovod takes them.
    got, received = tf.function(lambda x: hvd.alltoall(x, splits=[tf.shape(x)[0] // n] * n))(tf.fill([n], float(r)))
    c.equal("alltoall with a list of tensors as splits in a tf.function", got, [float(s) for s in range(n)])
    # Rank r sends s + 1 rows of value 10 * r + s to rank s.
    splits = [s + 1 for s in range(n)]
    x = tf.constant(np.concatenate([np.full([s + 1], 10 * r + s) for s in range(n)]), tf.float32)
    for mode, (out, received) in both_modes(lambda: hvd.alltoall(x, splits=splits)):
        c.equal(f"alltoall splits {mode}", out, np.concatenate([np.full([r + 1], 10 * s + r) for s in range(n)]))
        c.equal(f"alltoall received splits {mode}", received, [r + 1] * n, tf.int32)
    equal = tf.constant([10 * r + s for s in range(n)], tf.int64)
    c.equal("alltoall equal", hvd.alltoall(equal), [10 * s + r for s in range(n)])
    rows = 2 * n + 1
    full = expected_reduce("Sum", range(n), (rows, 2))
    start = sum(rows // n + (1 if i < rows % n else 0) for i in range(r))
    mine = full[start:start + rows // n + (1 if r < rows % n else 0)]
    for mode, got in both_modes(lambda: hvd.reducescatter(contribution(r, (rows, 2), tf.float32), op=hvd.Sum)):
        c.equal(f"reducescatter Sum {mode}", got, mine)
    got = hvd.grouped_reducescatter([contribution(r, (rows, 2), tf.float64)], op=hvd.Average)
    c.equal("grouped_reducescatter Average", got[0], mine / n)


def check_repeated_sized_calls(c, hvd, tf, env):
    """allgather, alltoall and reducescatter repeated under one name while their arguments change
    (the rows, the splits as a list or a tensor, the op, the dtype), eagerly and in a tf.function:
    each call's result is what it was given (the last result's shape is the next call's output
    guess, used only when it fits), and the results of earlier calls stay as they were."""
    n, r = hvd.size(), hvd.rank()
    kept = []

    def keep(what, got, want, dtype=None):
        c.equal(what, got, want, dtype)
        kept.append((what, got, np.asarray(want)))

    for mode, wrap in (("eager", lambda f: f), ("graph", tf.function)):
        for step, rows in enumerate((1, 1, 3, 3, 0, 1)):
            x = tf.fill([rows + r, 2], float(10 * r + step))
            want = np.concatenate([np.full([rows + q, 2], float(10 * q + step)) for q in range(n)])
            keep(f"allgather {mode} step {step}", wrap(lambda: hvd.allgather(x, name="repeat.ag"))(), want)
        for step, shift in enumerate((0, 0, 1, 1, 0)):
            splits = [(r + j + shift) % 3 for j in range(n)]
            x = tf.constant(np.concatenate([np.full([splits[j], 3], 100 * r + 10 * j + step) for j in range(n)]
                                           + [np.zeros([0, 3])]), tf.float32)
            given = tf.constant(splits, tf.int32) if step % 2 else splits  # a list or an integer tensor
            got, received = wrap(lambda: hvd.alltoall(x, splits=given, name="repeat.a2a"))()
            want_splits = [(q + r + shift) % 3 for q in range(n)]
            want = np.concatenate([np.full([want_splits[q], 3], 100 * q + 10 * r + step) for q in range(n)]
                                  + [np.zeros([0, 3])])
            keep(f"alltoall {mode} step {step}", got, want)
            c.equal(f"alltoall received splits {mode} step {step}", received, want_splits, tf.int32)
        rows = 2 * n + 1
        start = sum(rows // n + (1 if i < rows % n else 0) for i in range(r))
        part = slice(start, start + rows // n + (1 if r < rows % n else 0))
        for step, (op, dtype) in enumerate((("Sum", tf.float32), ("Sum", tf.float32), ("Max", tf.float32),
                                            ("Average", tf.float64), ("Sum", tf.float32))):
            x = contribution(r, (rows, 2), dtype)
            got = wrap(lambda: hvd.reducescatter(x, op=getattr(hvd, op), name="repeat.rs"))()
            keep(f"reducescatter {op} {mode} step {step}", got, expected_reduce(op, range(n), (rows, 2))[part], dtype)
    for what, got, want in kept:
        c.equal(f"{what}, after the later calls", got, want)


def check_gradients(c, hvd, tf, env):
    n, r = hvd.size(), hvd.rank()
    w = tf.constant([1.0, 2.0, 3.0])

    def grad_of(fn, x):
        def run():
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)  # 1-D, a multiple of 3 long: weighted by w repeated, times (rank + 1)
                weights = tf.tile(w, [tf.size(y) // 3]) * float(r + 1)
                loss = tf.reduce_sum(y * weights)
            return tape.gradient(loss, x)
        return both_modes(run)

    x = tf.constant([1.0, 1.0, 1.0])
    total = sum(s + 1 for s in range(n))
    for mode, g in grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum), x):
        c.equal(f"allreduce Sum grad {mode}", g, w.numpy() * total)
    for mode, g in grad_of(lambda t: hvd.allreduce(t, op=hvd.Average), x):
        c.close(f"allreduce Average grad {mode}", g, w.numpy() * total / n)
    # Horovod's gradients of broadcast and allgather average the incoming gradients over the ranks.
    for mode, g in grad_of(lambda t: hvd.broadcast(t, 0), x):
        c.close(f"broadcast grad {mode}", g, w.numpy() * total / n if r == 0 else np.zeros(3))
    # Broadcast's gradient builds the same ops on every rank (it multiplied by zero on the other
    # ranks only), so a collective named after its input later in the function gets one name on
    # every rank; before, the unnamed allreduce below waited for ever.
    xb = tf.constant([1.0, 2.0])

    @tf.function
    def bcast_then_unnamed():
        with tf.GradientTape() as tape:
            tape.watch(xb)
            y = tf.reduce_sum(hvd.broadcast(xb, root_rank=0, name="grad.bcast_then") * 3.0)
        return hvd.allreduce(tape.gradient(y, xb) * 2.0, op=hvd.Sum)

    graph = bcast_then_unnamed.get_concrete_function().graph
    captures = {t.op.name for t in graph.internal_captures}  # named after process-local ids
    ops = [op.name for op in graph.get_operations() if op.name not in captures]
    c.same("broadcast grad: the same ops on every rank", hvd.allgather_object(ops), [ops] * n)
    if hvd.allgather_object(ops) == [ops] * n:
        c.close("broadcast grad, then an unnamed allreduce", bcast_then_unnamed(), np.array([6.0, 6.0]))
    xg = tf.ones([3])
    # allgather output has 3n rows; row block s gets weights w * (r + 1) on rank r.
    for mode, g in grad_of(lambda t: hvd.allgather(t), xg):
        c.close(f"allgather grad {mode}", g, np.tile(w.numpy(), n)[3 * r:3 * r + 3] * total / n)
    xa = tf.ones([3 * n])
    for mode, g in grad_of(lambda t: hvd.alltoall(t), xa):
        c.equal(f"alltoall grad {mode}", g, np.concatenate([np.tile(w.numpy(), n)[3 * r:3 * r + 3] * (s + 1)
                                                              for s in range(n)]))
    xr = tf.ones([3 * n])
    # Horovod's: the allgathered gradient, times the size for Sum.
    for mode, g in grad_of(lambda t: hvd.reducescatter(t, op=hvd.Sum), xr):
        c.equal(f"reducescatter Sum grad {mode}", g, np.concatenate([w.numpy() * (s + 1) * n for s in range(n)]))
    for mode, g in grad_of(lambda t: hvd.reducescatter(t, op=hvd.Average), xr):
        c.equal(f"reducescatter Average grad {mode}", g, np.concatenate([w.numpy() * (s + 1) for s in range(n)]))
    # Min, Max and Product have no gradient of this form: every rank raises, in both modes.
    for op in (hvd.Min, hvd.Max, hvd.Product):
        for what, fn in (("allreduce", hvd.allreduce), ("reducescatter", hvd.reducescatter)):
            def refused(fn=fn, op=op):
                with tf.GradientTape() as tape:
                    tape.watch(xr)
                    loss = tf.reduce_sum(fn(xr, op=op))
                return tape.gradient(loss, xr)
            for mode, run in (("eager", refused), ("graph", tf.function(refused))):
                c.raises(f"{what} op {op} grad {mode}", [NotImplementedError], "defined for Sum and Average only",
                         run)
    # The scales apply to the gradient as to the allreduce's (and as horo_torch's reducescatter does).
    for mode, g in grad_of(lambda t: hvd.reducescatter(t, op=hvd.Sum, prescale_factor=4.0, postscale_factor=0.5), xr):
        c.equal(f"reducescatter scaled Sum grad {mode}", g,
                np.concatenate([w.numpy() * (s + 1) * n * 2.0 for s in range(n)]))
    # Eagerly, a collective of tensors no tape watches runs without a gradient wrapper.
    with tf.GradientTape() as tape:
        tape.watch(x)
        other = hvd.allreduce(w * float(r + 1), op=hvd.Sum, name="grad.unwatched")
        loss = tf.reduce_sum(x * other)
    c.equal("gradient beside an allreduce of an unwatched tensor", tape.gradient(loss, x), w.numpy() * total)
    v = tf.Variable([2.0, 3.0])
    with tf.GradientTape() as tape:
        y = hvd.grouped_allreduce([v * 2.0, v * v], op=hvd.Sum)
        loss = tf.reduce_sum(y[0]) + tf.reduce_sum(y[1])
    c.equal("grouped_allreduce grad through a variable", tape.gradient(loss, v), (2.0 + 2 * v.numpy()) * n)


def check_tape(c, hvd, tf, env):
    """DistributedGradientTape over N shards equals a plain tape on the whole batch."""
    import keras
    n, r = hvd.size(), hvd.rank()
    # sparse_as_dense gives a dense gradient also where nothing is reduced, as Horovod's: on a rank
    # outside the tape's process set, or in a set of one rank (2 ranks: the set is {1}).
    ps = env["process_set"]
    table = tf.Variable(tf.ones([n, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [r]))
    grad = hvd.DistributedGradientTape(tape, sparse_as_dense=True, op=hvd.Sum, process_set=ps).gradient(loss, table)
    c.same("sparse_as_dense gradient is dense", type(grad).__name__, "EagerTensor")
    c.equal("sparse_as_dense gradient", grad,
            [[float(s == r or (ps.included() and s in ps.ranks))] * 2 for s in range(n)])
    rng = np.random.default_rng(7)
    x = rng.normal(size=(6 * n, 4)).astype(np.float32)
    y = rng.normal(size=(6 * n, 1)).astype(np.float32)
    shard = slice(6 * r, 6 * r + 6)

    def model():
        keras.utils.set_random_seed(3)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)])

    for name, make_opt in (("SGD momentum", lambda: keras.optimizers.SGD(0.1, momentum=0.9)),
                           ("Adam", lambda: keras.optimizers.Adam(0.01))):
        for compiled in (False, True):
            dist, ref = model(), model()
            dist_opt, ref_opt = make_opt(), make_opt()
            if name == "Adam":  # horovod.tensorflow.DistributedOptimizer delegates to the Keras one
                dist_opt = hvd.DistributedOptimizer(dist_opt, op=hvd.Sum, gradient_predivide_factor=1.0)
                c.same("hvd.DistributedOptimizer wraps a Keras optimizer",
                       (isinstance(dist_opt, keras.optimizers.Adam),
                        "DistributedMixin" in str(type(dist_opt).__mro__)), (True, True))
                dist_opt = make_opt()

            def dist_step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((dist(xb) - yb) ** 2)
                tape = hvd.DistributedGradientTape(tape)
                # Horovod's signature: the fourth positional argument is use_generic_names.
                grads = tape.gradient(loss, dist.trainable_variables, None, compiled)
                dist_opt.apply_gradients(zip(grads, dist.trainable_variables))

            def ref_step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((ref(xb) - yb) ** 2)
                ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))

            step = tf.function(dist_step) if compiled else dist_step
            for _ in range(3):
                step(x[shard], y[shard])
                ref_step(x, y)
            mode = "tf.function" if compiled else "eager"
            for i, (a, b) in enumerate(zip(dist.get_weights(), ref.get_weights())):
                c.close(f"tape {name} {mode} weight {i}", a, b)

    for bad in (0, -2, True):
        c.raises(f"groups={bad!r}", [ValueError], "groups should be a positive integer",
                 lambda: hvd.DistributedGradientTape(tf.GradientTape(), groups=bad))
    import keras
    for what, make in (("tape", lambda: hvd.DistributedGradientTape(tf.GradientTape(), num_groups=2)),
                       ("Keras optimizer", lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), num_groups=2))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make()
        c.same(f"{what}: num_groups is deprecated, as in Horovod",
               [w.category.__name__ for w in caught if "num_groups" in str(w.message)], ["DeprecationWarning"])
    # tf.GradientTape's fourth positional argument, an UnconnectedGradients, still means that.
    v, unused = tf.Variable(float(r + 1)), tf.Variable(5.0)
    with tf.GradientTape() as tape:
        loss = 3.0 * v
    grads = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, [v, unused], None,
                                                                   tf.UnconnectedGradients.ZERO)
    c.equal("tape: unconnected_gradients=ZERO given positionally", [g.numpy() for g in grads], [3.0 * n, 0.0])
    # A rank without any gradient of a group submitted nothing for it, so the others' reduction paired
    # with its next step's (or, with groups, every rank waited). Where the ranks differ, all fail now.
    mismatch = [tf.errors.FailedPreconditionError], "Mismatched shapes"
    with tf.GradientTape() as tape:
        loss = 3.0 * v if r != n - 1 else tf.constant(0.0)
    c.raises("tape: no gradient on the last rank only", *mismatch,
             lambda: hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, [v]))
    with tf.GradientTape() as tape:
        loss = 3.0 * v + (2.0 * unused if r == 0 else 0.0)
    c.raises("tape groups: a group without gradients on some ranks", *mismatch,
             lambda: hvd.DistributedGradientTape(tape, op=hvd.Sum, groups=[[unused]]).gradient(loss, [v, unused]))
    with tf.GradientTape() as tape:
        loss = tf.constant(0.0)
    c.same("tape: no gradient on any rank", hvd.DistributedGradientTape(tape).gradient(loss, [v]), [None])
    c.equal("tape: the next reduction pairs with the same one on every rank",
            hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="after the missing gradients"), float(n))
    with tf.GradientTape() as tape:
        loss = 3.0 * v
    grads = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, (v,))
    c.same("tape: a tuple of sources gives a list, as Horovod's", type(grads).__name__, "list")
    c.equal("tape: a tuple of sources, the gradient", grads[0], 3.0 * n)

    # Partial: the local layer's gradient is this rank's own, divided by size.
    local_layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    shared = tf.Variable([1.0])
    local_layer.build((None, 1))
    with tf.GradientTape() as tape:
        out = local_layer(tf.constant([[float(r + 1)]])) * shared
        loss = tf.reduce_sum(out)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local_layer])
    g_local, g_shared = tape.gradient(loss, [local_layer.kernel, shared])
    c.equal("partial tape local gradient", g_local, [[(r + 1.0) / n]])
    c.close("partial tape shared gradient", g_shared, [sum(s + 1.0 for s in range(n)) / n])
    # Horovod 0.28's split of the same: (variable, gradient) pairs, local ones first.
    with tf.GradientTape() as tape:
        out = local_layer(tf.constant([[float(r + 1)]])) * shared
        loss = tf.reduce_sum(out)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local_layer])
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, [local_layer.kernel, shared])
    c.same("get_local_and_global_gradients: which variables",
           ([v is local_layer.kernel for v, _ in local_pairs], [v is shared for v, _ in global_pairs]), ([True], [True]))
    c.equal("get_local_and_global_gradients: the local gradient", local_pairs[0][1], [[(r + 1.0) / n]])
    c.close("get_local_and_global_gradients: the reduced gradient", global_pairs[0][1],
            [sum(s + 1.0 for s in range(n)) / n])

    check_tape_reduce_ops(c, hvd, tf, keras)


# Below this squared norm a vector's Adasum coefficient stays 1 (Horovod's sqrt(DBL_MIN)).
ADASUM_TINY = float(np.sqrt(np.finfo(np.float64).tiny))


def adasum_reference(vectors):
    """Horovod's Adasum tree in float64: pairs (v0, v1), (v2, v3), ..., then pairs of those."""
    v = [np.asarray(x, np.float64) for x in vectors]
    stride = 1
    while stride < len(v):
        for i in range(0, len(v) - stride, 2 * stride):
            a, b = v[i], v[i + stride]
            dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
            v[i] = (1 - dot / aa / 2 if aa >= ADASUM_TINY else 1) * a + (1 - dot / bb / 2 if bb >= ADASUM_TINY else 1) * b
        stride *= 2
    return v[0]


def check_tape_reduce_ops(c, hvd, tf, keras):
    """Horovod's tape reduces gradients with any reduce op: Adasum combines the ranks' gradients
    with its tree, Max takes the largest. The Keras optimizer stays at Average and Sum."""
    n, r = hvd.size(), hvd.rank()
    w0 = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    xs = [np.random.default_rng(40 + s).normal(size=4).astype(np.float32) for s in range(n)]
    local = [x * np.cos(w0 * x) for x in xs]  # each rank's gradient of sum(sin(w * x))
    w = tf.Variable(w0)

    def gradient(op, **kwargs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(w * xs[r]))
        return hvd.DistributedGradientTape(tape, op=op, **kwargs).gradient(loss, [w])[0]

    c.close("tape op=Adasum", gradient(hvd.Adasum), adasum_reference(local))
    c.close("tape op=Adasum in a tf.function", tf.function(lambda: gradient(hvd.Adasum))(), adasum_reference(local))
    c.close("tape op=Adasum, fp16 compression", gradient(hvd.Adasum, compression=hvd.Compression.fp16),
            adasum_reference(local), rtol=2e-3, atol=2e-3)
    c.close("tape op=Max", gradient(hvd.Max), np.max(local, axis=0))
    c.close("tape op=Min", gradient(hvd.Min), np.min(local, axis=0))

    table = tf.Variable(np.ones((5, 2), np.float32))

    def sparse_gradient(**kwargs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [r % 5]))
        return hvd.DistributedGradientTape(tape, op=hvd.Adasum, **kwargs).gradient(loss, [table])[0]

    c.raises("tape op=Adasum of IndexedSlices", [NotImplementedError], "sparse_as_dense=True", sparse_gradient)
    dense = np.zeros((n, 5, 2))
    for s in range(n):
        dense[s, s % 5] = 1.0
    c.close("tape op=Adasum of IndexedSlices with sparse_as_dense", sparse_gradient(sparse_as_dense=True),
            adasum_reference([d.ravel() for d in dense]).reshape(5, 2))
    c.raises("Keras DistributedOptimizer with op=Adasum", [ValueError], "op=Average or op=Sum, got op=Adasum;",
             lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum))
    c.raises("tape with an unknown op", [ValueError], "got op=17",
             lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=17))


def check_errors(c, hvd, tf, env):
    import pickle
    n, r = hvd.size(), hvd.rank()
    # Horovod's ops fail with a tf.errors.OpError (a mismatch: FailedPreconditionError); Horo's
    # error is that too, eagerly, and TensorFlow's UnknownError (an OpError) inside a tf.function.
    exc = c.raises("shape mismatch", [hvd.HoroMismatchError, RuntimeError, tf.errors.FailedPreconditionError],
                   "shape", lambda: hvd.allreduce(tf.ones([r + 1]), name="mismatch"))
    if exc is not None:
        copy = pickle.loads(pickle.dumps(exc))
        c.same("the error pickles", (type(copy), str(copy)), (type(exc), str(exc)))
    c.raises("grouped calls of one and of two tensors", [hvd.HoroMismatchError], "Mismatched grouped calls for "
             "allreduce tensor 'grouped_allreduce.sizes.0'",
             lambda: hvd.grouped_allreduce([tf.ones([2])] * (1 if r == 0 else 2), name="sizes"))
    c.raises("shape mismatch in a tf.function", [tf.errors.OpError], "Mismatched shapes",
             lambda: tf.function(lambda x: hvd.allreduce(x, name="mismatch.graph"))(tf.ones([r + 1])))
    # An unsupported dtype is an InvalidArgumentError (as Horovod's op) and a ValueError eagerly,
    # an OpError inside a tf.function (raised when the op runs, not while it is traced: the others
    # meet it there). Every rank gets it, also when one rank alone passed that dtype.
    complex_input = tf.constant([1 + 1j])
    c.raises("unsupported dtype eagerly", [hvd.HoroInvalidArgument, ValueError, tf.errors.InvalidArgumentError],
             f"ranks {', '.join(map(str, range(n)))} passed dtype complex128 for 'allreduce.noname",
             lambda: hvd.allreduce(complex_input))
    c.raises("unsupported dtype in a tf.function", [tf.errors.OpError], "which is not supported",
             lambda: tf.function(lambda x: hvd.allreduce(x))(complex_input))
    # Ragged and sparse tensors: TensorFlow's own conversion error named neither ("object of type
    # 'RaggedTensor' has no len()").
    c.raises("a RaggedTensor", [hvd.HoroInvalidArgument, ValueError, tf.errors.InvalidArgumentError],
             f"ranks {', '.join(map(str, range(n)))} passed a value of type RaggedTensor that could not be made a "
             "dense tensor (Horo's collectives take dense tensors (and tf.IndexedSlices in allreduce), got a "
             "RaggedTensor; pass value.to_tensor())", lambda: hvd.allreduce(tf.ragged.constant([[1.0], [2.0, 3.0]])))
    c.raises("a SparseTensor", [hvd.HoroInvalidArgument, ValueError], "got a SparseTensor; pass tf.sparse.to_dense",
             lambda: hvd.allgather(tf.sparse.SparseTensor([[0, 0]], [1.0], [2, 2])))
    c.raises("a RaggedTensor while tracing", [hvd.HoroInvalidArgument, ValueError],
             "got a RaggedTensor; pass value.to_tensor()",
             lambda: tf.function(lambda: hvd.allreduce(tf.ragged.constant([[1.0], [2.0, 3.0]])))())
    # A value one rank alone cannot make a tensor of fails the collective on every rank eagerly, as
    # an unsupported dtype does, instead of raising there while the others wait for it.
    last, none_text = n - 1, "that could not be made a dense tensor (Attempt to convert a value (None)"
    c.raises("None on the last rank alone", [hvd.HoroInvalidArgument, ValueError, tf.errors.InvalidArgumentError],
             f"allreduce tensor 'allreduce.one.none': rank {last} passed a value of type NoneType {none_text}",
             lambda: hvd.allreduce(None if r == last else tf.ones([1]), name="one.none"))
    c.raises("unnamed, None on rank 0 alone", [hvd.HoroInvalidArgument],
             f"allreduce tensor 'allreduce.noname': rank 0 passed a value of type NoneType {none_text}",
             lambda: hvd.allreduce(None if r == 0 else 1.0))
    c.raises("rows of different lengths on rank 0 alone, broadcast", [hvd.HoroInvalidArgument],
             "broadcast tensor 'broadcast.one.rows': rank 0 passed a value of type list that could not be made a "
             "dense tensor (Can't convert non-rectangular Python sequence to Tensor.)",
             lambda: hvd.broadcast([[1.0], [2.0, 3.0]] if r == 0 else [[1.0, 2.0]], 0, name="one.rows"))
    ragged_text = ("that could not be made a dense tensor (Horo's collectives take dense tensors (and "
                   "tf.IndexedSlices in allreduce), got a RaggedTensor; pass value.to_tensor())")
    c.raises("a RaggedTensor in a group, on the last rank alone", [hvd.HoroInvalidArgument],
             f"allgather tensor 'grouped_allgather.one.ragged.0': rank {last} passed a value of type RaggedTensor "
             f"for 'grouped_allgather.one.ragged.1' {ragged_text}",
             lambda: hvd.grouped_allgather([tf.ones([1]), tf.ragged.constant([[1.0], []]) if r == last
                                            else tf.ones([2])], name="one.ragged"))
    c.raises("None on rank 0 alone, alltoall", [hvd.HoroInvalidArgument],
             f"alltoall tensor 'alltoall.one.none': rank 0 passed a value of type NoneType {none_text}",
             lambda: hvd.alltoall(None if r == 0 else tf.ones([n]), name="one.none"))
    c.raises("None on the last rank alone, reducescatter", [hvd.HoroInvalidArgument],
             f"reducescatter tensor 'reducescatter.one.none': rank {last} passed a value of type NoneType {none_text}",
             lambda: hvd.reducescatter(None if r == last else tf.ones([n]), name="one.none"))
    c.raises("None on rank 0 alone, grouped reducescatter", [hvd.HoroInvalidArgument],
             f"reducescatter tensor 'grouped_reducescatter.noname.0': rank 0 passed a value of type NoneType for "
             f"'grouped_reducescatter.noname.1' {none_text}",
             lambda: hvd.grouped_reducescatter([tf.ones([n]), None if r == 0 else tf.ones([n])]))
    c.raises("unsupported dtype on the last rank alone", [hvd.HoroInvalidArgument, tf.errors.InvalidArgumentError],
             f"allreduce tensor 'allreduce.one.complex': rank {n - 1} passed dtype complex128 for "
             "'allreduce.one.complex', which is not supported",
             lambda: hvd.allreduce(complex_input if r == n - 1 else tf.ones([1]), name="one.complex"))
    c.raises("unsupported dtype on the last rank alone, in a tf.function", [tf.errors.OpError],
             f"rank {n - 1} passed dtype complex128 for 'allgather.one.complex.graph'",
             lambda: tf.function(lambda x: hvd.allgather(x, name="one.complex.graph"))(
                 complex_input if r == n - 1 else tf.ones([1])))
    c.raises("average beside op on the last rank alone", [hvd.HoroInvalidArgument, ValueError,
                                                         tf.errors.InvalidArgumentError],
             f"allreduce tensor 'allreduce.both': rank {last} passed an invalid argument: The op parameter supersedes "
             "average. Please provide only one of them.",
             lambda: hvd.allreduce(tf.ones([1]), average=True if r == last else None, op=hvd.Sum, name="both"))
    # A scale given as a tf.Tensor (no hashable value) on one rank: read as the number it holds.
    c.equal("a tf.Tensor for a scale on the last rank alone", hvd.allreduce(
        tf.ones([2]), op=hvd.Sum, prescale_factor=tf.constant(2.0) if r == last else 2.0, name="scale.tensor"),
        [2.0 * n] * 2)
    c.equal("a tf.Tensor for a reducescatter's scale on rank 0 alone", hvd.reducescatter(
        tf.ones([n]), op=hvd.Sum, prescale_factor=tf.constant(2.0) if r == 0 else 2.0, name="rs.scale.tensor"),
        [2.0 * n])
    # Bad alltoall splits are an InvalidArgumentError and a ValueError on every rank eagerly (no
    # tape: straight to the core), and an OpError in a tf.function.
    rows = tf.ones([n + 1, 2])
    for what, splits in (("too few splits", [n + 1]), ("splits not summing to the rows", [1] * n)):
        c.raises(f"alltoall, {what}, eagerly", [ValueError, tf.errors.InvalidArgumentError], "splits",
                 lambda: hvd.alltoall(rows, splits=splits, name="bad.splits"))
        c.raises(f"alltoall, {what}, in a tf.function", [tf.errors.OpError], "splits",
                 lambda: tf.function(lambda x: hvd.alltoall(x, splits=splits, name="bad.splits.graph"))(rows))
    c.raises("unregistered process set", [ValueError], "not registered",
             lambda: hvd.allreduce(tf.ones([1]), process_set=hvd.ProcessSet([0])))
    c.raises("unregistered process set while tracing", [hvd.HoroInvalidArgument, ValueError], "not registered",
             lambda: tf.function(lambda x: hvd.allreduce(x, process_set=hvd.ProcessSet([0])))(tf.ones([1])))

    @tf.function(jit_compile=True)
    def xla_step(x):
        return hvd.allreduce(x)

    c.raises("XLA is refused", [Exception], "jit_compile=False", lambda: xla_step(tf.ones([2])))
    c.raises("broadcast_global_variables refuses eager execution, as Horovod's", [RuntimeError],
             "does not support eager execution", lambda: hvd.broadcast_global_variables(0))
    c.raises("DistributedOptimizer of neither a TF1 nor a Keras optimizer", [ValueError],
             "doesn't inherit from either legacy TensorFlow or Keras optimizer",
             lambda: hvd.DistributedOptimizer(object()))
    c.equal("a collective still works after the errors", hvd.allreduce(tf.ones([2]), op=hvd.Sum), [n, n])


def check_join(c, hvd, tf, env):
    n, r = hvd.size(), hvd.rank()
    if r != 0:
        # Rank 0 has joined: it takes part with zeros.
        c.equal("allreduce beside a joined rank", hvd.allreduce(tf.constant([float(r)]), op=hvd.Sum, name="late"),
                [float(sum(range(1, n)))])
        slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([r]), tf.constant([n, 2]))
        c.raises("IndexedSlices beside a joined rank", [hvd.HoroMismatchError], "sparse_as_dense=True",
                 lambda: hvd.allreduce(slices, name="late.sparse"))
        # The same gradient densified: rank s's row holds s + 1, the joined rank's row zeros.
        table = tf.Variable(tf.zeros([n, 2]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [r])) * (r + 1.0)
        grad = hvd.DistributedGradientTape(tape, sparse_as_dense=True, op=hvd.Sum).gradient(loss, table)
        c.equal("sparse_as_dense gradient beside a joined rank", grad,
                [[0.0, 0.0]] + [[s + 1.0, s + 1.0] for s in range(1, n)])
    last = int(hvd.join().numpy())
    c.same("join returns a rank that joined after rank 0", last in range(1, n), True)


def check_join_uneven_steps(c, hvd, tf, env):
    """Rank r runs r + 1 training steps (a tf.function with a SyncBatchNormalization and a
    DistributedGradientTape), then joins: inside a tf.function in round 0, eagerly in round 1.
    Joined ranks count as zeros, and for nothing in the batch statistics."""
    n, r = hvd.size(), hvd.rank()
    v = tf.Variable([0.0, 0.0])
    bn = hvd.SyncBatchNormalization(momentum=0.0, center=False, scale=False)
    bn.build((None, 1))

    @tf.function
    def step(x):
        bn(x[:1, tf.newaxis], training=True)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * x)
        grad = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, v)
        v.assign_sub(grad)
        return grad

    join_in_function = tf.function(hvd.join)
    for mode, join in (("tf.function", join_in_function), ("eager", hvd.join)):
        for k in range(r + 1):
            # At step k the ranks s >= k are still training.
            got = step(tf.constant([float(r + 1), 1.0]))
            c.equal(f"{mode} join: step {k} sums the ranks still training", got,
                    [float(sum(s + 1 for s in range(k, n))), float(n - k)])
            c.close(f"{mode} join: step {k} batch mean over the ranks still training", bn.moving_mean.numpy(),
                    [np.mean([s + 1.0 for s in range(k, n)])])
            # A metric logged with an unnamed eager allreduce: rank r makes r + 1 such calls.
            c.equal(f"{mode} join: step {k} unnamed eager allreduce", hvd.allreduce(tf.constant([1.0]), op=hvd.Sum),
                    [float(n - k)])
        c.same(f"{mode} join: the rank with the most steps joins last", int(join().numpy()), n - 1)
        c.equal(f"{mode} join: collectives go on after the join",
                hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name=f"after.join.{mode}"), [float(n)])
        # Unnamed ones too, although the ranks made different numbers of unnamed calls before.
        c.equal(f"{mode} join: unnamed eager allreduce after the join", hvd.allreduce(tf.constant([2.0]), op=hvd.Sum),
                [2.0 * n])


def sync_bn_cases(n):
    """(label, per-row shape, axis, masked, rows per rank): uneven batches; with 3+ ranks the last
    rank's batch is empty."""
    rows = [3 + 2 * s for s in range(n)]
    if n > 2:
        rows[-1] = 0
    return [("features", (3,), -1, False, rows), ("channels_first", (2, 3, 3), 1, False, rows),
            ("masked sequence", (4, 3), -1, True, rows)]


def check_sync_batch_norm(c, hvd, tf, env):
    """SyncBatchNormalization over uneven per-rank batches equals BatchNormalization over their
    concatenation: outputs, input and weight gradients, moving statistics; eagerly and in
    tf.function, two steps each; inference unchanged."""
    import keras
    n, r = hvd.size(), hvd.rank()
    for label, shape, axis, masked, rows in sync_bn_cases(n):
        rng = np.random.default_rng(21)
        x_all = (rng.normal(size=(sum(rows),) + shape) * 3.0 + 1.0).astype(np.float32)
        w_all = rng.normal(size=x_all.shape).astype(np.float32)
        mask_all = rng.random(x_all.shape[:-1]) < 0.7 if masked else None
        mine = slice(sum(rows[:r]), sum(rows[:r + 1]))
        channels = ((None,) + shape)[axis]
        gamma, beta = rng.normal(size=channels).astype(np.float32), rng.normal(size=channels).astype(np.float32)
        for mode in ("eager", "tf.function"):
            def make(cls):
                layer = cls(axis=axis, momentum=0.5)
                layer.build((None,) + shape)
                layer.set_weights([gamma, beta, np.zeros(channels, np.float32), np.ones(channels, np.float32)])
                return layer

            dist, ref = make(hvd.SyncBatchNormalization), make(keras.layers.BatchNormalization)

            def run(layer, x, w, mask):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = layer(x, training=True, mask=mask)
                    loss = tf.reduce_sum(y * w)
                dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
                return y, dx, dgamma, dbeta

            dist_run, ref_run = (run, run) if mode == "eager" else (tf.function(run), tf.function(run))
            mask_mine = None if mask_all is None else tf.constant(mask_all[mine])
            mask_ref = None if mask_all is None else tf.constant(mask_all)
            for step in range(2):
                y, dx, dgamma, dbeta = dist_run(dist, tf.constant(x_all[mine]), tf.constant(w_all[mine]), mask_mine)
                ry, rdx, rdgamma, rdbeta = ref_run(ref, tf.constant(x_all), tf.constant(w_all), mask_ref)
                what = f"SyncBatchNormalization {label} {mode} step {step}"
                c.close(f"{what}: output", y, ry.numpy()[mine], rtol=1e-4, atol=1e-5)
                c.close(f"{what}: input gradient", dx, rdx.numpy()[mine], rtol=1e-4, atol=1e-4)
                summed = hvd.grouped_allreduce([dgamma, dbeta], op=hvd.Sum, name=f"sbn.{label}.{mode}.{step}")
                c.close(f"{what}: gamma gradient summed over ranks", summed[0], rdgamma, rtol=1e-4, atol=1e-4)
                c.close(f"{what}: beta gradient summed over ranks", summed[1], rdbeta, rtol=1e-4, atol=1e-4)
            for got, want, name in ((dist.moving_mean, ref.moving_mean, "moving mean"),
                                    (dist.moving_variance, ref.moving_variance, "moving variance")):
                c.close(f"SyncBatchNormalization {label} {mode}: {name}", got.numpy(), want.numpy(), rtol=1e-5,
                        atol=1e-5)
            c.close(f"SyncBatchNormalization {label} {mode}: inference uses the moving statistics",
                    dist(tf.constant(x_all[mine]), training=False), ref(tf.constant(x_all[mine]), training=False))

    # Inference issues no collective (a rank may evaluate alone); training issues one.
    layer = hvd.SyncBatchNormalization()
    layer.build((None, 3))

    def op_types(training):
        fn = tf.function(lambda x: layer(x, training=training))
        return {op.type for op in fn.get_concrete_function(tf.TensorSpec([None, 3])).graph.get_operations()}

    c.same("no collective in inference mode", "PyFunc" in op_types(False), False)
    c.same("one collective in training mode", "PyFunc" in op_types(True), True)

    # mixed_float16: float16 inputs whose squares overflow float16 once summed; statistics in float32.
    rows = [4 + s for s in range(n)]
    x_all = (np.random.default_rng(3).normal(size=(sum(rows), 2)) * 20.0 + 200.0).astype(np.float16)
    mine = slice(sum(rows[:r]), sum(rows[:r + 1]))
    dist = hvd.SyncBatchNormalization(dtype="mixed_float16", momentum=0.5)
    ref = keras.layers.BatchNormalization(dtype="mixed_float16", momentum=0.5)
    y = dist(tf.constant(x_all[mine]), training=True)
    ry = ref(tf.constant(x_all), training=True)
    c.same("mixed_float16: output dtype and statistics' dtype", (y.dtype, dist.moving_mean.dtype),
           (tf.float16, tf.float32))
    c.close("mixed_float16: output", y.numpy().astype(np.float32), ry.numpy()[mine].astype(np.float32), rtol=1e-2,
            atol=1e-2)
    c.close("mixed_float16: moving mean", dist.moving_mean.numpy(), ref.moving_mean.numpy(), rtol=1e-3)
    c.close("mixed_float16: moving variance", dist.moving_variance.numpy(), ref.moving_variance.numpy(), rtol=1e-3)

    c.raises("fused=True is refused", [ValueError], "fused", lambda: hvd.SyncBatchNormalization(fused=True))
    c.raises("synchronized=True is refused", [ValueError], "synchronized",
             lambda: hvd.SyncBatchNormalization(synchronized=True))
    config = hvd.SyncBatchNormalization(axis=1, momentum=0.9, epsilon=1e-4).get_config()
    clone = keras.layers.deserialize(keras.layers.serialize(hvd.SyncBatchNormalization.from_config(config)))
    c.same("SyncBatchNormalization round-trips through Keras serialization",
           (type(clone), clone.axis, clone.momentum, clone.epsilon), (hvd.SyncBatchNormalization, 1, 0.9, 1e-4))


def check_process_sets(c, hvd, tf, env):
    r = hvd.rank()
    ps = env["process_set"]
    if r in ps.ranks:
        c.equal("allreduce on a process set", hvd.allreduce(tf.constant([float(r)]), op=hvd.Sum, process_set=ps),
                [float(sum(ps.ranks))])
        c.equal("size_op of the set", hvd.size_op(ps.process_set_id), len(ps.ranks))
    c.equal("process_set_included_op", hvd.process_set_included_op(ps.process_set_id), int(r in ps.ranks))


def check_torch_beside(c, hvd, tf, env):
    """horo_torch and horo_tf share one initialized runtime."""
    import torch

    import horo_torch
    n, r = hvd.size(), hvd.rank()
    c.same("horo_torch sees the same job", (horo_torch.is_initialized(), horo_torch.rank(), horo_torch.size()),
           (True, r, n))
    t = horo_torch.allreduce(torch.tensor([float(r)]), op=horo_torch.Sum)
    c.same("torch allreduce", t.tolist(), [float(sum(range(n)))])
    c.equal("tf allreduce after torch", hvd.allreduce(tf.constant([float(r)]), op=hvd.Sum), [float(sum(range(n)))])


def check_tf1_optimizer_eagerly(c, hvd, tf, env):
    """A tf.compat.v1.train optimizer wrapped by DistributedOptimizer, minimizing eagerly: averaged
    gradients; with backward_passes_per_step=2 an update of the summed passes every second call;
    Adasum combining orthogonal moves (rank r moves only entry r)."""
    n, r = hvd.size(), hvd.rank()
    v1 = tf.compat.v1
    scale = np.zeros(n, np.float32)
    scale[r] = r + 1.0
    own = 0.1 * np.arange(1, n + 1)
    for kwargs, want in (({}, [1.0 - own / n]), ({"backward_passes_per_step": 2}, [np.ones(n), 1.0 - 2 * own / n]),
                         ({"op": hvd.Adasum}, [1.0 - own])):
        w = tf.Variable(tf.ones([n]))
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), **kwargs)
        for i, values in enumerate(want):
            opt.minimize(lambda: tf.reduce_sum(w * scale), var_list=[w])
            c.close(f"TF1 optimizer eagerly {kwargs}, call {i + 1}", w.numpy(), values)
        # In a tf.function (traced twice when it makes variables: the optimizer's state outlives it).
        w.assign(tf.ones([n]))
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), **kwargs)
        @tf.function
        def step():
            opt.minimize(lambda: tf.reduce_sum(w * scale), var_list=[w])

        for i, values in enumerate(want):
            step()
            c.close(f"TF1 optimizer in a tf.function {kwargs}, call {i + 1}", w.numpy(), values)


def check_aggregation_helper(c, hvd, tf, env):
    """Horovod's LocalGradientAggregationHelper (and its Eager form) used directly, with a user's
    allreduce_func and a Keras optimizer, eagerly and in a tf.function: with 2 passes and
    average_aggregated_gradients, nothing moves after the first pass, then the mean of the two
    passes' sums, averaged over the ranks, is applied; the optimizer's iterations count both passes; a
    local variable keeps its own mean, divided by the size (allreduce_func never sees it); a None
    gradient reaches allreduce_func as None, as in Horovod's eager helper, and stays None."""
    import keras
    n, r = hvd.size(), hvd.rank()
    sent = []

    def allreduce_func(grads, variables):
        sent.append([(id(v), g is None) for g, v in zip(grads, variables)])
        return [None if g is None else hvd.allreduce(g, op=hvd.Average, name=f"aggregated.{i}")
                for i, g in enumerate(grads)]

    helpers = {"eager helper": lambda: hvd.LocalGradientAggregationHelperEager(2, allreduce_func, False, True),
               "graph helper": lambda: hvd.LocalGradientAggregationHelper(
                   2, allreduce_func, False, True, r, hvd.LocalGradientAggregationHelper._OPTIMIZER_TYPE_KERAS)}
    for kind, make in helpers.items():
        for traced in (False, True):
            w, b, unused = tf.Variable([1.0, 1.0]), tf.Variable(1.0), tf.Variable(3.0)
            helper = make()
            helper.register_local_var(b)
            opt = keras.optimizers.SGD(0.5)
            opt.build([w, b])

            def step(k):
                grads = helper.compute_gradients([tf.fill([2], k * (r + 1)), k * (r + 1), None], [w, b, unused])
                pairs = [(g, v) for g, v in zip(grads, [w, b, unused]) if g is not None]
                helper.apply_gradients(lambda: opt.apply_gradients(pairs), opt, pairs)

            run = tf.function(step) if traced else step
            what = f"{kind}{' in a tf.function' if traced else ''}"
            del sent[:]
            run(tf.constant(1.0))
            c.close(f"{what}: nothing applied after one pass", [*w.numpy(), b.numpy()], [1.0, 1.0, 1.0])
            run(tf.constant(2.0))
            mean = 1.5 * (r + 1)  # this rank's two passes, 1 and 2 times (r + 1), averaged
            c.close(f"{what}: w after two passes", w.numpy(), np.full(2, 1.0 - 0.5 * 1.5 * (n + 1) / 2.0))
            c.close(f"{what}: the local b", b.numpy(), 1.0 - 0.5 * mean / n)
            c.close(f"{what}: the unused variable", unused.numpy(), 3.0)
            c.same(f"{what}: iterations", int(opt.iterations.numpy()), 2)
            if not traced:
                c.same(f"{what}: what allreduce_func got", sent, [[(id(w), False), (id(unused), True)]])
    c.raises("the helper refuses 0 passes", [ValueError], "backward_passes_per_step must be at least 1",
             lambda: hvd.LocalGradientAggregationHelperEager(0, allreduce_func, False, True))


GROUPS = [check_topology, check_allreduce, check_indexed_slices, check_allgather_broadcast,
          check_alltoall_reducescatter, check_repeated_sized_calls, check_gradients, check_tape, check_errors,
          check_join, check_join_uneven_steps, check_sync_batch_norm, check_process_sets, check_torch_beside,
          check_tf1_optimizer_eagerly, check_aggregation_helper]


def run_all_checks():
    import os

    import tensorflow as tf

    import horo_tf as hvd
    tf.get_logger().setLevel("ERROR")  # retracing notices: the checks trace on purpose
    n = int(os.environ["HORO_SIZE"])
    ps = hvd.ProcessSet([0, n - 1] if n > 2 else [1])
    hvd.init(process_sets=[ps])
    env = {**os.environ, "process_set": ps}
    report = run_groups(GROUPS, hvd, tf, env)
    hvd.shutdown()
    return report


@pytest.mark.parametrize("size", SIZES, ids=[f"np{n}" for n in SIZES])
def test_tf_collectives(size):
    reports = horo_runner.run(run_all_checks, num_proc=size, env=CHILD_ENV)
    assert_reports(reports, size, GROUPS)
