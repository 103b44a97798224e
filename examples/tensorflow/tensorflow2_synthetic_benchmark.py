"""Training step time on synthetic data: no communication, Horo, and MultiWorkerMirroredStrategy.

    hororun -np 2 python examples/tensorflow/tensorflow2_synthetic_benchmark.py

One job times the same model and the same ``tf.function`` training step three ways:

* **local**: the plain step, every rank on its own (no communication): the baseline;
* **horo**: the step with ``hvd.DistributedGradientTape`` (what a Horovod user writes);
* **mwms**: the step under TensorFlow's own ``tf.distribute.MultiWorkerMirroredStrategy``, every
  rank one worker (the workers find each other through Horo). If the strategy cannot start, the
  report says so and why.

The modes take turns: each of ``--num-iters`` repeats runs every mode (the order rotates between
repeats) for ``--num-warmup-batches`` untimed and ``--num-batches-per-iter`` timed steps, and ranks
enter each block together. Every step is timed on its own; a mode's step time is the median over
all its timed steps, and the job's is the slowest rank's. The overhead of a mode is its step time
minus local's: what communication costs per step. Images per second are reported as Horovod's
benchmark does. The default model is a small convolutional network that fits a CPU; pass
``--model ResNet50`` (or another keras.applications name) on real hardware.
"""
import argparse
import json
import os
import socket
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

from horo_core import basics, numpy_ops  # noqa: E402
from horo_core._binding import lib  # noqa: E402

MODES = ("local", "horo", "mwms")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small_cnn", help="small_cnn or a keras.applications model name")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=3, help="untimed steps per block")
    parser.add_argument("--num-batches-per-iter", type=int, default=20, help="timed steps per block")
    parser.add_argument("--num-iters", type=int, default=15, help="repeats; each runs every mode once")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--fp16-allreduce", action="store_true", help="horo: send gradients as float16")
    parser.add_argument("--peer", choices=["mwms", "none"], default="mwms",
                        help="peer measured in the same run: tf.distribute.MultiWorkerMirroredStrategy, or none")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m and not (args.peer == "none" and m == "mwms")]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; choose from {','.join(MODES)}")
    if not args.modes:
        parser.error("--modes: nothing left to run (--peer none drops mwms)")
    return args


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def exchange_worker_addresses():
    """Every rank's host:port, in rank order, agreed through Horo before TensorFlow starts (the
    strategy must be created before any TensorFlow operation runs)."""
    mine = f"{socket.gethostname()}:{free_port()}".encode().ljust(256, b"\0")
    gathered = numpy_ops.allgather(basics.runtime(), np.frombuffer(mine, dtype=np.uint8).reshape(1, 256),
                                   "benchmark.worker_addresses")
    return [bytes(row).rstrip(b"\0").decode() for row in gathered]


def make_mwms():
    """(strategy, None) or (None, reason)."""
    import tensorflow as tf
    workers = exchange_worker_addresses()
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                          "task": {"type": "worker", "index": basics.rank()}})
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(), None
    except Exception as exc:  # noqa: BLE001 - reported to the user as the reason
        return None, f"{type(exc).__name__}: {exc}"


def make_model(keras, args):
    if args.model == "small_cnn":
        return keras.Sequential([
            keras.Input((args.image_size, args.image_size, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(1000),
        ])
    # Logits, as for the small CNN: the loss takes them (from_logits=True), not softmax outputs.
    return getattr(keras.applications, args.model)(weights=None, input_shape=(args.image_size, args.image_size, 3),
                                                   classifier_activation=None)


def build_steps(args, strategy):
    """{mode: a no-argument training step}, each with its own model and optimizer."""
    import keras
    import tensorflow as tf

    import horo_tf as hvd

    keras.utils.set_random_seed(0)
    images = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    labels = tf.random.uniform([args.batch_size], maxval=1000, dtype=tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    steps = {}

    def plain_step(distributed):
        model, optimizer = make_model(keras, args), keras.optimizers.SGD(0.01)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            if distributed:
                tape = hvd.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        step()  # builds the optimizer, so that its state can be broadcast too
        if distributed:
            hvd.broadcast_variables(model.variables + list(optimizer.variables), root_rank=0)
        return step

    if "local" in args.modes:
        steps["local"] = plain_step(False)
    if "horo" in args.modes:
        steps["horo"] = plain_step(True)
    if strategy is not None:
        with strategy.scope():
            mwms_model, mwms_optimizer = make_model(keras, args), keras.optimizers.SGD(0.01)

        def replica_step():
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, mwms_model(images, training=True)) / strategy.num_replicas_in_sync
            grads = tape.gradient(loss, mwms_model.trainable_variables)
            mwms_optimizer.apply_gradients(zip(grads, mwms_model.trainable_variables))

        @tf.function
        def mwms_step():
            strategy.run(replica_step)

        steps["mwms"] = mwms_step
    return steps


def run_block(step, args):
    """Warmup, then the timed steps; returns each timed step's seconds."""
    for _ in range(args.num_warmup_batches):
        step()
    seconds = []
    for _ in range(args.num_batches_per_iter):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds


def slowest_rank(value, name):
    """The largest value over all ranks."""
    return float(numpy_ops.allreduce(basics.runtime(), np.array([value]), name, op=lib.HORO_OP_MAX)[0])


def main():
    args = parse_args()
    basics.init()
    strategy, reason = make_mwms() if "mwms" in args.modes else (None, None)
    # Every rank must run the same modes, or their barriers and steps no longer pair up: if the
    # strategy failed on any rank (say, another process took its port first), no rank uses it.
    if "mwms" in args.modes and slowest_rank(float(strategy is None), "benchmark.mwms_failed") > 0 and strategy:
        strategy, reason = None, "it failed to start on another rank"

    def log(text):
        if basics.rank() == 0:
            print(text, flush=True)

    steps = build_steps(args, strategy)
    log(f"Model: {args.model}, batch size {args.batch_size} per rank, {basics.size()} ranks, modes "
        f"{','.join(steps)}; {args.num_iters} repeats of {args.num_warmup_batches} warmup + "
        f"{args.num_batches_per_iter} timed steps per mode")
    if strategy is None and "mwms" in args.modes:
        log(f"mwms: MultiWorkerMirroredStrategy cannot run here ({reason}); no comparison with it.")

    times = {mode: [] for mode in steps}
    order = list(steps)
    for repeat in range(args.num_iters):
        rotated = order[repeat % len(order):] + order[:repeat % len(order)]
        medians = []
        for mode in rotated:
            numpy_ops.barrier(basics.runtime())  # every rank starts the block together
            seconds = run_block(steps[mode], args)
            times[mode] += seconds
            medians.append(f"{mode} {1e3 * np.median(seconds):.2f} ms")
        log(f"Repeat #{repeat}: " + ", ".join(medians) + " (rank 0's median step)")

    step_ms = {mode: 1e3 * slowest_rank(np.median(times[mode]), f"benchmark.median.{mode}") for mode in steps}
    log("mode   | median step | img/sec per rank | img/sec total | overhead vs local")
    for mode, ms in step_ms.items():
        overhead = f"{ms - step_ms['local']:+.2f} ms" if "local" in step_ms else "n/a"
        log(f"{mode:6} | {ms:8.2f} ms | {args.batch_size / ms * 1e3:16.1f} | "
            f"{basics.size() * args.batch_size / ms * 1e3:13.1f} | {overhead}")
    if {"local", "horo", "mwms"} <= set(step_ms):
        horo, mwms = step_ms["horo"] - step_ms["local"], step_ms["mwms"] - step_ms["local"]
        ratio = f"{horo / mwms:.2f}" if mwms > 0 else "n/a (mwms overhead <= 0)"
        log(f"Overhead horo / mwms: {ratio} ({horo:.2f} ms vs {mwms:.2f} ms per step)")
    basics.shutdown()


if __name__ == "__main__":
    main()
