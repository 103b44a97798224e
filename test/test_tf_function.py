"""horo_tf's collectives inside ``tf.function``: ranks that trace differently, tapes wrapped inside
their own block, and collectives in a function's branches, loops and calls, on 2 real processes.
The collectives themselves, eagerly and in a ``tf.function``, are test_tf_ops.py's."""
import numpy as np

import horo_runner
from tf_checks import CHILD_ENV


def _retrace_and_wrap_inside():
    """Two cases that once failed: a tf.function that only one rank traces again (a shorter last
    batch there) with unnamed collectives in it (the ranks' call-order names then differed and
    both waited forever), and a tape wrapped inside its own with block (a crash)."""
    import tensorflow as tf

    import horo_tf as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    v = tf.Variable([1.0, 2.0])

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            gathered = hvd.allgather(x * v)
            loss = tf.reduce_sum(gathered)
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        # A Python value, named after the constant it becomes (a call-order counter differed).
        twice = hvd.allreduce(2.0, op=hvd.Sum)
        return hvd.allreduce(tf.cast(tf.shape(gathered)[0], tf.float32), op=hvd.Sum), tape.gradient(loss, v), twice

    rows_per_step = [[2, 2, 1], [2, 2, 2]][r]  # rank 0 traces step a second time at the last step
    steps = []
    for rows in rows_per_step:
        total, grad, twice = step(tf.ones([rows, 2]))
        steps.append((float(total), grad.numpy().tolist(), float(twice)))

    # An inner tf.function's tensors are named like the outer one's ("mul:0"); their unnamed
    # collectives, which may run side by side, must still get different names.
    from horo_tf import _bridge
    names = []

    @tf.function
    def inner(x):
        y = x * v
        names.append(_bridge.auto_name("allreduce", 0, [y]))
        return hvd.allreduce(y, op=hvd.Sum)

    @tf.function
    def outer(x):
        y = x * 2.0
        names.append(_bridge.auto_name("allreduce", 0, [y]))
        return hvd.allreduce(y, op=hvd.Sum), inner(x)

    nested = [t.numpy().tolist() for t in outer(tf.ones([2]))]

    # Gradients of a tf.function's collectives, taken by a tape outside it: TensorFlow names the
    # backward function after a process-wide counter, which rank 0 alone moved on here by tracing
    # another function (the ranks waited on each other's names forever).
    if r == 0:
        tf.function(lambda: tf.constant(1.0) * 2)()

    @tf.function
    def summed(x):
        return hvd.allreduce(x, op=hvd.Sum)

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(summed(v * (r + 1.0)))
    outside_tape = tape.gradient(loss, v).numpy().tolist()
    # A second order (a gradient penalty): its graph is named after two counters.
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            y = tf.reduce_sum(summed(v * v) * v)
        penalty = tf.reduce_sum(inner.gradient(y, v))
    second_order = outer.gradient(penalty, v).numpy().tolist()

    # The same with the tape in an outer tf.function, which rank 1 alone traces again (its last
    # batch is smaller), around an inner function's allgather.
    @tf.function
    def gathered_rows(h):
        return hvd.allgather(h)

    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(gathered_rows(x * v))
        return hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, v)

    nested_tape = [train_step(tf.ones([1 if r == 1 and i == 2 else 2, 2])).numpy().tolist() for i in range(3)]

    wrapped = []
    for persistent in (False, True):
        with tf.GradientTape(persistent=persistent) as tape:
            loss = tf.reduce_sum(v * float(r + 1))
            tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
            inside = tape.gradient(loss, v).numpy().tolist()  # inside the with block, as TF allows
        with tf.GradientTape(persistent=persistent) as tape:
            loss = tf.reduce_sum(v * float(r + 1))
            tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        outside = tape.gradient(loss, v).numpy().tolist()
        with tf.GradientTape() as plain:  # TensorFlow's tape stack is intact afterwards
            loss = tf.reduce_sum(v * 3.0)
        wrapped.append((inside, outside, plain.gradient(loss, v).numpy().tolist()))
    hvd.shutdown()
    return n, steps, wrapped, names, nested, outside_tape, nested_tape, second_order


def test_unnamed_collectives_agree_when_one_rank_retraces_and_a_tape_wraps_inside_its_block():
    env = {**CHILD_ENV, "HORO_STALL_CHECK_TIME_SECONDS": "5", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "30"}
    reports = horo_runner.run(_retrace_and_wrap_inside, num_proc=2, env=env)
    for r, (n, steps, wrapped, names, nested, outside_tape, nested_tape, second_order) in enumerate(reports):
        # v is the same on both ranks: y's gradient is 2v S(v) + S(v^2) with S the sum over ranks,
        # 3n v^2, and the penalty's is 6n v.
        assert second_order == [6.0 * n * x for x in (1.0, 2.0)], f"rank {r}: {second_order}"
        # d/dv of sum(allreduce_sum((r+1) v)) is (r+1) times the allreduced ones: 2 on each rank.
        assert outside_tape == [2.0 * (r + 1)] * 2, f"rank {r}: {outside_tape}"
        # The allgather's gradient averages the ranks' (all-ones) upstream gradients; each rank's
        # d/dv is its row count, summed over the ranks: 4, 4, then 3.
        assert nested_tape == [[4.0, 4.0], [4.0, 4.0], [3.0, 3.0]], f"rank {r}: {nested_tape}"
        assert len(names) == 2 and names[0] != names[1], f"rank {r}: {names}"
        assert nested == [[4.0, 4.0], [2.0, 4.0]], f"rank {r}: {nested}"
        # Rows gathered: 4, 4, then 3, summed over the 2 ranks. The loss sums the gathered rows; the
        # allgather's gradient (averaged) is 1 on every row, so d loss / d v on a rank is its own row
        # count, and the tape sums those over the ranks.
        assert steps == [(8.0, [4.0, 4.0], 4.0), (8.0, [4.0, 4.0], 4.0), (6.0, [3.0, 3.0], 4.0)], f"rank {r}: {steps}"
        total = float(sum(s + 1 for s in range(n)))
        assert wrapped == [([total] * 2, [total] * 2, [3.0, 3.0])] * 2, f"rank {r}: {wrapped}"


def _collectives_in_control_flow():
    import keras
    import tensorflow as tf

    import horo_tf as hvd

    hvd.init()
    r = hvd.rank()
    # Keras's LossScaleOptimizer applies the gradients, and so reduces them, in a tf.cond branch: a
    # graph of its own. The allreduce of the loss after it waited only on the optimizer's finiteness
    # check, so the ranks could start it and the branch's reduction in either order.
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(4)(inp)))
    opt = keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), initial_scale=16.0)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return hvd.allreduce(loss, name="loss")

    hvd.broadcast_variables(model.variables, 0)
    x = tf.constant(np.random.RandomState(r).randn(4, 4).astype("float32"))
    losses = [float(step(x)) for _ in range(200)]
    keras.mixed_precision.set_global_policy("float32")

    # The same with Horo's own collectives: in a cond branch, a while loop's body and a nested
    # tf.function, each between collectives outside.
    @tf.function
    def inner(v):
        return hvd.allreduce(v, op=hvd.Sum, name="inner")

    @tf.function
    def mixed(v):
        a = hvd.allreduce(v, op=hvd.Sum, name="before")
        b = tf.cond(tf.reduce_sum(v) > 0, lambda: hvd.allreduce(v * 2.0, op=hvd.Sum, name="branch"), lambda: v)
        c = hvd.allreduce(v * 3.0, op=hvd.Sum, name="after_cond")
        d = tf.while_loop(lambda i, s: i < 2, lambda i, s: (i + 1, s + hvd.allreduce(v, op=hvd.Sum, name="body")),
                          (tf.constant(0), tf.zeros_like(v)))[1]
        e = hvd.allreduce(v * 4.0, op=hvd.Sum, name="after_loop")
        f = inner(v * 5.0)
        g = hvd.allreduce(v * 6.0, op=hvd.Sum, name="after_call")
        return tf.stack([a, b, c, d, e, f, g])

    sums = [mixed(tf.fill([3], float(r + 1))).numpy()[:, 0].tolist() for _ in range(60)]
    weights = [w.numpy().tolist() for w in model.trainable_variables]

    # Whether the ranks meet the race above depends on timing: the graph's order is checked too.
    # Each op that calls a graph holding a collective waits on the collective before it, and the
    # next collective waits on that op.
    graph = mixed.get_concrete_function(tf.fill([3], 1.0)).graph
    ops = graph.get_operations()

    def ancestors(op):
        seen, stack = set(), list(op.control_inputs) + [t.op for t in op.inputs]
        while stack:
            o = stack.pop()
            if o.name not in seen:
                seen.add(o.name)
                stack.extend(list(o.control_inputs) + [t.op for t in o.inputs])
        return seen

    collectives = [op for op in ops if op.type == "PyFunc"]
    callers = [op for op in ops if op.type in ("If", "While", "StatefulPartitionedCall")]
    order = [collectives[0], callers[0], collectives[1], callers[1], collectives[2], callers[2], collectives[3]]
    chained = [order[i].name in ancestors(order[i + 1]) for i in range(len(order) - 1)]
    hvd.shutdown()
    return losses, weights, sums, [op.type for op in order], chained


def test_collectives_in_a_tf_function_s_branches_loops_and_calls_keep_one_order():
    env = {**CHILD_ENV, "HORO_STALL_CHECK_TIME_SECONDS": "5", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "20"}
    reports = horo_runner.run(_collectives_in_control_flow, num_proc=2, env=env)
    (losses0, weights0, sums0, types, chained), (losses1, weights1, sums1, _, _) = reports
    assert types == ["PyFunc", "If", "PyFunc", "While", "PyFunc", "StatefulPartitionedCall", "PyFunc"]
    assert chained == [True] * 6, chained
    assert losses0 == losses1 and len(losses0) == 200
    assert weights0 == weights1
    total = 1.0 + 2.0  # v is r + 1 on each rank
    assert sums0 == sums1 == [[total, 2 * total, 3 * total, 2 * total, 4 * total, 5 * total, 6 * total]] * 60
