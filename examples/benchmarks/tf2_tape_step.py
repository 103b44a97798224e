"""TF2 training step (tf.function + GradientTape): Horo's DistributedGradientTape against the same step
without communication.

    hororun -np 2 python examples/benchmarks/tf2_tape_step.py

The same MLP as tf1_session_step.py (16 layers of 512x512 by default: 17 MB of gradients, all
reduced in one grouped allreduce per step) is trained by two tf.functions that differ only in the
tape: a plain ``tf.GradientTape`` (local: every rank on its own, the ceiling) and
``hvd.DistributedGradientTape`` around it (horo: gradients averaged every step). The modes take
turns in each repeat, ranks entering each block together; every step is timed, a mode's step time
is the median of its steps, and the job's the slowest rank's.
"""
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horo_tf as hvd  # noqa: E402
from mlp_step_report import parse_args, report  # noqa: E402


def train_step(weights, data, distributed):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            h = data
            for w in weights:
                h = tf.nn.relu(h @ w)
            loss = tf.reduce_mean(h * h)
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        for w, g in zip(weights, tape.gradient(loss, weights)):
            w.assign_sub(0.001 * g)
    return step


def main():
    args = parse_args(__doc__.split("\n\n")[0])
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    weights = [tf.Variable(tf.random.normal([args.width, args.width], stddev=0.04, seed=i))
               for i in range(args.layers)]
    data = tf.constant(np.random.default_rng(hvd.rank()).normal(size=(args.batch_size, args.width)),
                       dtype=tf.float32)
    modes = {"local": train_step(weights, data, False), "horo": train_step(weights, data, True)}
    step_times = {m: [] for m in modes}
    for repeat in range(args.repeats):
        for mode in (list(modes) if repeat % 2 == 0 else list(modes)[::-1]):
            for _ in range(2):
                modes[mode]()
            hvd.allreduce(tf.zeros(1), name="barrier")  # ranks enter each block together
            for _ in range(args.steps):
                start = time.perf_counter()
                modes[mode]()
                step_times[mode].append(time.perf_counter() - start)
    slowest = hvd.allgather_object({m: float(np.median(t)) for m, t in step_times.items()})
    if hvd.rank() == 0:
        report("TF2", args, hvd.size(), slowest)


if __name__ == "__main__":
    main()
