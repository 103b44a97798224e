"""TF1 training step (graph + session.run): Horo's DistributedOptimizer against the same step without
communication.

    hororun -np 2 python examples/benchmarks/tf1_session_step.py

One job builds the same MLP twice in one TF1 graph, fed through placeholders: once trained by a
plain ``tf.compat.v1.train.MomentumOptimizer`` (local: every rank on its own, the ceiling), once by
``hvd.DistributedOptimizer`` around it (horo: gradients averaged every step). The modes take turns
in each repeat; every step is timed, a mode's step time is the median of its steps, and the job's
the slowest rank's. Also reported: how long building the distributed step took beside the plain one
(the chain of collectives walks the graph once).
"""
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horo_tf as hvd  # noqa: E402
from mlp_step_report import parse_args, report  # noqa: E402

v1 = tf.compat.v1


def build(scope, args, distributed):
    with v1.variable_scope(scope):
        x = v1.placeholder(tf.float32, [None, args.width])
        h = x
        for i in range(args.layers):
            w = v1.get_variable(f"w{i}", [args.width, args.width], initializer=v1.glorot_uniform_initializer())
            h = tf.nn.relu(tf.matmul(h, w))
        loss = tf.reduce_mean(h * h)
        opt = v1.train.MomentumOptimizer(0.001, 0.9)
        if distributed:
            opt = hvd.DistributedOptimizer(opt)
        start = time.perf_counter()
        train = opt.minimize(loss)
        return x, train, time.perf_counter() - start


def main():
    args = parse_args(__doc__.split("\n\n")[0])
    v1.disable_v2_behavior()
    hvd.init()
    config = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
    modes = {"local": build("local", args, False), "horo": build("horo", args, True)}
    step_times = {m: [] for m in modes}
    data = np.random.default_rng(hvd.rank()).normal(size=(args.batch_size, args.width)).astype(np.float32)
    barrier = hvd.allreduce(tf.constant(0.0), name="barrier")  # ranks enter each block together
    with v1.Session(config=config) as session:
        session.run(v1.global_variables_initializer())
        for repeat in range(args.repeats):
            order = list(modes) if repeat % 2 == 0 else list(modes)[::-1]
            for mode in order:
                x, train, _ = modes[mode]
                session.run(barrier)
                for _ in range(2):
                    session.run(train, {x: data})
                for _ in range(args.steps):
                    start = time.perf_counter()
                    session.run(train, {x: data})
                    step_times[mode].append(time.perf_counter() - start)
        medians = {m: float(np.median(t)) for m, t in step_times.items()}
        slowest = hvd.allgather_object(medians, session=session)
    if hvd.rank() == 0:
        report("TF1", args, hvd.size(), slowest)
        print(f"building minimize: local {1e3 * modes['local'][2]:.0f} ms, horo {1e3 * modes['horo'][2]:.0f} ms")


if __name__ == "__main__":
    main()
