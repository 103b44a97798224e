"""horo_tf in TF1 graphs (``session.run``): collectives inside TF1 control flow and fetched
together, broadcast_global_variables, the object helpers with a session.

Eager execution is switched off for a whole process, so each mode is a job of its own: ``v1`` is
``tf.compat.v1.disable_v2_behavior()`` (reference variables, TF1 control flow: what a TF1 script on
TensorFlow 2 calls), ``graph`` only ``disable_eager_execution()`` (resource variables, TF2 control
flow). Every expected value is exact.
"""
import numpy as np
import pytest

import horo_runner
from tf_checks import CHILD_ENV, assert_reports, run_groups

MODES = ["v1", "graph"]


def check_control_flow(c, hvd, tf, env):
    """Collectives in a cond branch (taken or not) and in a while body, then one more after them:
    a collective outside never waits on one inside a branch that did not run."""
    v1 = tf.compat.v1
    r, n = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [2])
        taken = v1.placeholder(tf.bool, [])
        first = hvd.allreduce(x, op=hvd.Sum)
        branch = tf.cond(taken, lambda: hvd.allreduce(x * 2.0, op=hvd.Sum), lambda: x)
        after = hvd.allreduce(branch + first, op=hvd.Sum)

        def body(i, acc):
            acc = hvd.allreduce(acc, op=hvd.Sum)
            return i + 1, tf.cond(i < 1, lambda: hvd.allreduce(acc, op=hvd.Sum), lambda: acc)

        _, looped = tf.while_loop(lambda i, acc: i < 3, body, [tf.constant(0), first])
        last = hvd.allreduce(looped, op=hvd.Sum)
        with v1.Session() as session:
            mine = np.float32([1.0, r])
            total = np.float32([n, sum(range(n))])
            for flag in (True, False, True):
                got = session.run([branch, after], {x: mine, taken: flag})
                c.close(f"cond branch ({flag})", got[0], 2.0 * total if flag else mine)
                # after = the sum over ranks of branch + first
                c.close(f"collective after the cond ({flag})", got[1], 3.0 * n * total if flag else (n + 1) * total)
            c.close("while loop", session.run(last, {x: mine}), total * float(n) ** 5)


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


GROUPS = [check_control_flow, check_collectives_fetched_together, check_object_helpers, check_broadcast_global_variables]


def run_tf1_checks(mode):
    import tensorflow as tf

    import horo_tf as hvd
    if mode == "v1":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")
    hvd.init()
    report = run_groups(GROUPS, hvd, tf, {})
    hvd.shutdown()
    return report


@pytest.mark.parametrize("mode", MODES)
def test_tf1_graph_api(mode):
    # A run whose ranks start collectives in different orders stalls: then fail after 30 s.
    env = {**CHILD_ENV, "HORO_STALL_CHECK_TIME_SECONDS": "10", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "30"}
    reports = horo_runner.run(run_tf1_checks, args=(mode,), num_proc=2, env=env)
    assert_reports(reports, 2, GROUPS)
