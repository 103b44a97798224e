"""horo_tf in TF1 graphs (``session.run``): Horovod's TF1 training API (DistributedOptimizer around
a ``tf.compat.v1.train`` optimizer, BroadcastGlobalVariablesHook, broadcast_global_variables, the
object helpers with a session) and collectives inside TF1 control flow.

Eager execution is switched off for a whole process, so each mode is a job of its own: ``v1`` is
``tf.compat.v1.disable_v2_behavior()`` (reference variables, TF1 control flow: what a TF1 script on
TensorFlow 2 calls), ``graph`` only ``disable_eager_execution()`` (resource variables, TF2 control
flow). Every expected value comes from one process training on all ranks' data, or is exact.
"""
import numpy as np
import pytest

import horo_runner
from tf_checks import CHILD_ENV, assert_reports, run_groups

MODES = ["v1", "graph"]


def batch(step, rank):
    """Rank's inputs at a step: 4 rows of 3 features, targets, and 3 embedding ids."""
    rng = np.random.default_rng(100 * step + rank)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    return x, x @ np.float32([1.0, -2.0, 0.5]) + 0.25, rng.integers(0, 5, size=3)


def build_model(tf, rank):
    """Placeholders, variables with rank-dependent starting values (an embedding, whose gradient is
    IndexedSlices, among them), and the loss."""
    v1 = tf.compat.v1
    x, y = v1.placeholder(tf.float32, [None, 3]), v1.placeholder(tf.float32, [None])
    ids = v1.placeholder(tf.int32, [None])
    w = v1.get_variable("w", initializer=tf.constant([0.1 * rank, 1.0, 2.0]))
    b = v1.get_variable("b", initializer=tf.constant(float(rank)))
    emb = v1.get_variable("emb", initializer=tf.constant(np.arange(10, dtype=np.float32).reshape(5, 2) + rank))
    loss = tf.reduce_mean((tf.linalg.matvec(x, w) + b - y) ** 2) + tf.reduce_mean(tf.nn.embedding_lookup(emb, ids))
    return (x, y, ids), [w, b, emb], loss


def reference_training(tf, optimizer, steps, size, passes=1, dense=False):
    """What one process reaches training on every rank's batches at once, from rank 0's values: the
    loss is the mean of the ranks' losses (of the passes' losses, each update taking `passes`);
    dense: IndexedSlices gradients applied as dense tensors (as sparse_as_dense does)."""
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        models = []
        with v1.variable_scope("model"):
            models.append(build_model(tf, 0))
        with v1.variable_scope("model", reuse=True):
            models += [build_model(tf, 0) for _ in range(size * passes - 1)]
        variables = models[0][1]
        loss = tf.add_n([m[2] for m in models]) / float(size * passes)
        opt = optimizer()
        pairs = opt.compute_gradients(loss)
        if dense:
            pairs = [(tf.convert_to_tensor(g), v) for g, v in pairs]
        train = opt.apply_gradients(pairs)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for update in range(steps // passes):
                feed = {}
                for k, (inputs, _, _) in enumerate(models):
                    feed.update(zip(inputs, batch(update * passes + k // size, k % size)))
                session.run(train, feed)
            return session.run(variables)


def check_hook_and_optimizer(c, hvd, tf, env):
    """Horovod's TF1 example: MonitoredTrainingSession, BroadcastGlobalVariablesHook and
    DistributedOptimizer(AdamOptimizer); the hook's broadcast runs without the step's inputs."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        with v1.variable_scope("model"):
            inputs, variables, loss = build_model(tf, r)
        opt = hvd.DistributedOptimizer(v1.train.AdamOptimizer(0.05))
        c.same("the TF1 optimizer's class", isinstance(opt, v1.train.Optimizer), True)
        c.same("its name", opt.get_name(), "DistributedAdamOptimizer")
        global_step = v1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=global_step)
        c.same("slot names of the wrapped optimizer", sorted(opt.get_slot_names()), ["m", "v"])
        with v1.train.MonitoredTrainingSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as session:
            start = session.run(variables)
            c.close("w after the hook", start[0], [0.0, 1.0, 2.0])
            c.close("emb after the hook", start[2], np.arange(10).reshape(5, 2))
            for step in range(4):
                session.run(train, dict(zip(inputs, batch(step, r))))
            got, steps = session.run([variables, global_step])
    c.same("global_step", int(steps), 4)
    want = reference_training(tf, lambda: v1.train.AdamOptimizer(0.05), 4, n)
    for name, g, w in zip(("w", "b", "emb"), got, want):
        c.close(f"{name} after 4 steps, against one process", g, w, rtol=1e-5, atol=1e-6)


def check_groups_and_hook(c, hvd, tf, env):
    """Gradients in groups, one group needing no feeds (a decay term only): the hook's broadcast,
    built after them, still runs without the step's feeds."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [])
        w = v1.get_variable("w", initializer=tf.constant(5.0 + r))
        decayed = v1.get_variable("decayed", initializer=tf.constant(2.0 + r))
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.5), groups=[[w], [decayed]])
        train = opt.minimize(w * x + 0.5 * decayed ** 2)
        with v1.train.MonitoredTrainingSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as session:
            session.run(train, {x: float(r + 1)})
            got = session.run([w, decayed])
    c.close("w, the mean of the ranks' gradients", got[0], 5.0 - 0.5 * (n + 1) / 2.0)
    c.close("decayed, by its own decay", got[1], 2.0 - 0.5 * 2.0)


def check_backward_passes(c, hvd, tf, env):
    """backward_passes_per_step=2 with average_aggregated_gradients: an update every second pass from
    the mean of both passes' averaged gradients; global_step counts every pass."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    momentum = (lambda: v1.train.MomentumOptimizer(0.05, 0.9))
    with tf.Graph().as_default():
        with v1.variable_scope("model"):
            inputs, variables, loss = build_model(tf, r)
        opt = hvd.DistributedOptimizer(momentum(), backward_passes_per_step=2, average_aggregated_gradients=True,
                                       sparse_as_dense=True)
        global_step = v1.train.get_or_create_global_step()
        unused = v1.get_variable("unused", initializer=tf.constant(1.0))
        pairs = opt.compute_gradients(loss, var_list=variables + [unused])
        # The usual filtering of variables without a gradient before apply_gradients.
        train = opt.apply_gradients([(g, v) for g, v in pairs if g is not None], global_step=global_step)
        bcast = hvd.broadcast_global_variables(0)
        with v1.Session() as session:
            session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            session.run(bcast)
            start = session.run(variables)
            seen = []
            for step in range(4):
                session.run(train, dict(zip(inputs, batch(step, r))))
                seen.append(session.run([variables[0], global_step]))
            got = session.run(variables)
    c.close("no update after the first pass", seen[0][0], start[0])
    c.same("global_step after each pass", [int(s[1]) for s in seen], [1, 2, 3, 4])
    want = reference_training(tf, momentum, 4, n, passes=2, dense=True)
    for name, g, w in zip(("w", "b", "emb"), got, want):
        c.close(f"{name} after 2 updates of 2 passes, against one process", g, w, rtol=1e-5, atol=1e-6)


def check_adasum(c, hvd, tf, env):
    """op=Adasum: each rank applies its own gradient; the moves (orthogonal here: rank r moves only
    entry r) are combined, so every rank ends at the sum of them (exact values)."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    for passes in (1, 2):
        with tf.Graph().as_default():
            w = v1.get_variable("w", initializer=tf.ones([n]))
            loss = w[r] * float(r + 1)
            opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum,
                                           backward_passes_per_step=passes)
            c.same("the delta optimizer's name", opt.get_name(), "DistributedDeltaGradientDescentOptimizer")
            train = opt.minimize(loss)
            with v1.Session() as session:
                session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
                values = []
                for _ in range(2):
                    session.run(train)
                    values.append(session.run(w))
        own = np.ones(n, np.float32)
        own[r] -= 0.1 * (r + 1)
        combined = 1.0 - 0.1 * np.arange(1, n + 1)
        if passes == 1:
            c.close("Adasum after one step", values[0], combined)
            c.close("Adasum after two steps", values[1], 1.0 - 0.2 * np.arange(1, n + 1))
        else:
            c.close("own move only, before the combination", values[0], own)
            c.close("combined moves of two passes", values[1], 1.0 - 0.2 * np.arange(1, n + 1))


def check_local_variable(c, hvd, tf, env):
    """register_local_var: that variable's gradient stays the rank's own, divided by the size."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant(5.0))
        b = v1.get_variable("b", initializer=tf.constant(5.0))
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0))
        opt.register_local_var(b)
        train = opt.minimize((w + b) * float(r + 1))
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(train)
            got = session.run([w, b])
    c.close("shared w", got[0], 5.0 - (n + 1) / 2.0)
    c.close("local b", got[1], 5.0 - (r + 1) / n)


def check_own_process_set(c, hvd, tf, env):
    """backward_passes_per_step=2 with a process set of rank 0 alone: rank 0 (its set's only member)
    and the others (outside it) each apply the sum of their own two passes."""
    v1 = tf.compat.v1
    r = hvd.rank()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [])
        w = v1.get_variable("w", initializer=tf.constant(10.0))
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2,
                                       process_set=env["rank_0_alone"])
        train = opt.minimize(w * x)
        with v1.Session() as session:
            session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            for k in (1.0, 2.0):
                session.run(train, {x: k * (r + 1)})
            got = session.run(w)
    c.close("the sum of this rank's two passes", got, 10.0 - 3.0 * (r + 1))
    with tf.Graph().as_default():
        unknown = hvd.ProcessSet([0])
        unknown.process_set_id = 10  # no such set: refused while the graph is built, as Horovod's
        c.raises("an unregistered process set id", [ValueError], "names no registered process set",
                 lambda: hvd.allreduce(tf.ones(4), process_set=unknown))


def check_control_flow(c, hvd, tf, env):
    """Collectives in a cond branch (taken or not) and in a while body, then one more after them:
    a collective outside never waits on one inside a branch that did not run."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [2])
        taken = v1.placeholder(tf.bool, [])
        first = hvd.allreduce(x, op=hvd.Sum)
        ones = tf.ones([2])  # two collectives on one input that needs no feed
        twice = [hvd.allreduce(ones, op=hvd.Sum, name=name) for name in ("ones.a", "ones.b")]
        branch = tf.cond(taken, lambda: hvd.allreduce(x * 2.0, op=hvd.Sum), lambda: x)
        after = hvd.allreduce(branch + first, op=hvd.Sum)

        def body(i, acc):
            acc = hvd.allreduce(acc, op=hvd.Sum)
            return i + 1, tf.cond(i < 1, lambda: hvd.allreduce(acc, op=hvd.Sum), lambda: acc)

        _, looped = tf.while_loop(lambda i, acc: i < 3, body, [tf.constant(0), first])
        last = hvd.allreduce(looped, op=hvd.Sum)
        # A loop whose body reads another placeholder; a later collective without it runs alone.
        y = v1.placeholder(tf.float32, [2])
        _, looped_y = tf.while_loop(lambda i, acc: i < 2, lambda i, acc: (i + 1, hvd.allreduce(acc, op=hvd.Sum) + y),
                                    [tf.constant(0), x])
        after_loop_y = hvd.allreduce(looped_y, op=hvd.Sum)
        alone = hvd.allreduce(x * 3.0, op=hvd.Sum)
        with v1.Session() as session:
            mine = np.float32([1.0, r])
            total = np.float32([n, sum(range(n))])
            for flag in (True, False, True):
                got = session.run([branch, after], {x: mine, taken: flag})
                c.close(f"cond branch ({flag})", got[0], 2.0 * total if flag else mine)
                # after = the sum over ranks of branch + first
                c.close(f"collective after the cond ({flag})", got[1], 3.0 * n * total if flag else (n + 1) * total)
            c.close("while loop", session.run(last, {x: mine}), total * float(n) ** 5)
            c.close("two collectives on one input", session.run(twice), [[n, n], [n, n]])
            ones = np.ones(2, np.float32)
            c.close("while loop reading another placeholder", session.run(after_loop_y, {x: mine, y: ones}),
                    n * (n * total + n) + n)
            c.close("a collective after it, without that placeholder", session.run(alone, {x: mine}), 3.0 * total)


def check_collectives_fetched_together(c, hvd, tf, env):
    """Eight allreduces of one placeholder, fetched by one run on a single inter-op thread: each
    waits on the one traced before it (same feeds), so no rank starts them in another order."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [3])
        outs = [hvd.allreduce(x * float(i + 1), op=hvd.Sum) for i in range(8)]
        config = v1.ConfigProto(inter_op_parallelism_threads=1, use_per_session_threads=True)
        with v1.Session(config=config) as session:
            for _ in range(5):
                got = session.run(outs, {x: np.full(3, r, np.float32)})
    c.close("the eighth allreduce", got[-1], np.full(3, 8.0 * sum(range(n))))


def check_object_helpers(c, hvd, tf, env):
    """broadcast_object and allgather_object run their collectives in the session given, or the
    default one; without either they say so."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        with v1.Session() as session:
            c.same("broadcast_object, session=", hvd.broadcast_object({"from": r}, root_rank=n - 1, session=session),
                   {"from": n - 1})
            with session.as_default():
                c.same("allgather_object in the default session", hvd.allgather_object(("rank", r)),
                       [("rank", k) for k in range(n)])
        c.raises("without a session", [ValueError], "pass session=", lambda: hvd.broadcast_object(r))
        fn = hvd.broadcast_object_fn(root_rank=0)
        v1.get_default_graph().finalize()  # as a MonitoredTrainingSession does
        with v1.Session() as session, session.as_default():
            c.same("broadcast_object_fn in a finalized graph", [fn(("a", r)), fn([r] * (r + 3))],
                   [("a", 0), [0, 0, 0]])


def check_broadcast_global_variables(c, hvd, tf, env):
    """broadcast_global_variables returns the op that session.run runs; broadcast_variables and
    broadcast_ give ops to run too."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        v = v1.get_variable("v", initializer=tf.constant([float(r + 1)] * 3))
        w = v1.get_variable("w", initializer=tf.constant(float(10 * (r + 1))))
        op = hvd.broadcast_global_variables(0)
        x = v1.get_variable("x", initializer=tf.constant(float(r)))
        y = v1.get_variable("y", initializer=tf.constant(float(r)))
        group = hvd.broadcast_variables([x], root_rank=n - 1)
        read = hvd.broadcast_(y, root_rank=n - 1)
        rank_op = hvd.rank_op()  # local: runs no collective built before it
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            c.close("before", session.run(v), [float(r + 1)] * 3)
            session.run(op)
            c.close("v from rank 0", session.run(v), [1.0] * 3)
            c.close("w from rank 0", session.run(w), 10.0)
            session.run(v1.global_variables_initializer())
            session.run(group)
            c.close("broadcast_variables", session.run(x), float(n - 1))
            c.close("broadcast_", session.run(read), float(n - 1))
            if r == 0:
                c.same("rank_op run on rank 0 alone", int(session.run(rank_op)), 0)


def check_aggregation_helper(c, hvd, tf, env):
    """Horovod's LocalGradientAggregationHelper used directly in a TF1 graph, around a TF1 optimizer:
    the sum of 2 passes, summed over the ranks by the user's allreduce_func, applied every second
    pass; the global_step given as a keyword counts every pass."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [])
        w = v1.get_variable("w", initializer=tf.constant(10.0))
        global_step = v1.train.get_or_create_global_step()
        helper = hvd.LocalGradientAggregationHelper(
            2, lambda grads, variables: [hvd.allreduce(g, op=hvd.Sum) for g in grads], False, False, r,
            hvd.LocalGradientAggregationHelper._OPTIMIZER_TYPE_LEGACY, name="helper")
        opt = v1.train.GradientDescentOptimizer(1.0)
        pairs = list(zip(helper.compute_gradients([tf.gradients(w * x, w)[0]], [w]), [w]))
        train = helper.apply_gradients(lambda: opt.apply_gradients(pairs, global_step=global_step), opt, pairs,
                                       global_step=global_step)
        with v1.Session() as session:
            session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            seen = []
            for k in (1.0, 2.0, 1.0):
                session.run(train, {x: k * (r + 1)})
                seen.append(session.run([w, global_step]))
    moved = 10.0 - 3.0 * n * (n + 1) / 2.0  # both passes of every rank, summed
    c.close("w after each pass", [s[0] for s in seen], [10.0, moved, moved])
    c.same("global_step after each pass", [int(s[1]) for s in seen], [1, 2, 3])


GROUPS = [check_hook_and_optimizer, check_groups_and_hook, check_backward_passes, check_adasum, check_local_variable,
          check_own_process_set, check_control_flow, check_collectives_fetched_together, check_object_helpers,
          check_broadcast_global_variables, check_aggregation_helper]


def run_tf1_checks(mode):
    import tensorflow as tf

    import horo_tf as hvd
    if mode == "v1":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    rank_0_alone = hvd.ProcessSet([0])
    hvd.init(process_sets=[rank_0_alone])
    report = run_groups(GROUPS, hvd, tf, {"rank_0_alone": rank_0_alone})
    hvd.shutdown()
    return report


@pytest.mark.parametrize("mode", MODES)
def test_tf1_graph_api(mode):
    # A run whose ranks start collectives in different orders stalls: then fail after 30 s.
    env = {**CHILD_ENV, "HORO_STALL_CHECK_TIME_SECONDS": "10", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "30"}
    reports = horo_runner.run(run_tf1_checks, args=(mode,), num_proc=2, env=env)
    assert_reports(reports, 2, GROUPS)


def test_tf1_optimizer_refusals():
    """What the TF1 DistributedOptimizer refuses, before any collective."""
    import tensorflow as tf

    import horo_tf as hvd
    v1 = tf.compat.v1
    with pytest.raises(ValueError, match="Adasum does not support average_aggregated_gradients"):
        hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum,
                                 average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="backward_passes_per_step must be at least 1"):
        hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=0)
    with tf.Graph().as_default():
        emb = v1.get_variable("emb", [5, 2])
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=2)
        with pytest.raises(ValueError, match="IndexedSlices are not supported when `backward_passes_per_step` > 1"):
            opt.compute_gradients(tf.reduce_sum(tf.nn.embedding_lookup(emb, [1, 2])))
