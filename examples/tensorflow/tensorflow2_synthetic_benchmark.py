"""Training throughput on synthetic data: a tf.function step with DistributedGradientTape.

    hororun -np 2 python examples/tensorflow/tensorflow2_synthetic_benchmark.py [--peer]

Reports images per second per rank and in total, as Horovod's benchmark does. ``--peer`` then runs
the same model and step under TensorFlow's own ``MultiWorkerMirroredStrategy`` (every rank one
worker; the workers find each other through Horo), and says plainly if that strategy cannot run.
The default model is a small convolutional network so that the benchmark fits a CPU; pass
``--model ResNet50`` (or another keras.applications name) on real hardware.
"""
import argparse
import json
import os
import socket
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

from horo_core import basics, numpy_ops  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_cnn", help="small_cnn or a keras.applications model name")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=3)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--peer", action="store_true", help="also run tf.distribute.MultiWorkerMirroredStrategy")
    return parser.parse_args()


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


def make_peer_strategy():
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
    return getattr(keras.applications, args.model)(weights=None, input_shape=(args.image_size, args.image_size, 3))


def time_steps(step, args, log):
    """Runs the warmup and timed iterations; returns the images per second of each iteration."""
    for _ in range(args.num_warmup_batches):
        step()
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        log(f"Iter #{i}: {rates[-1]:.1f} img/sec per rank")
    return rates


def report(name, rates, size, log):
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log(f"{name}: {mean:.1f} +-{conf:.1f} img/sec per rank, {size * mean:.1f} +-{size * conf:.1f} img/sec on "
        f"{size} ranks")


def main():
    args = parse_args()
    basics.init()
    strategy, reason = make_peer_strategy() if args.peer else (None, None)

    import keras
    import tensorflow as tf

    import horo_tf as hvd

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: {args.model}, batch size {args.batch_size} per rank, {hvd.size()} ranks")
    keras.utils.set_random_seed(0)
    images = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    labels = tf.random.uniform([args.batch_size], maxval=1000, dtype=tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    model = make_model(keras, args)
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function
    def horo_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    horo_step()  # builds the optimizer, so that its state can be broadcast too
    hvd.broadcast_variables(model.variables + list(optimizer.variables), root_rank=0)
    report("Horo", time_steps(horo_step, args, log), hvd.size(), log)

    if args.peer:
        if strategy is None:
            log(f"Peer: MultiWorkerMirroredStrategy cannot run here ({reason}); no comparison made.")
        else:
            with strategy.scope():
                peer_model = make_model(keras, args)
                peer_optimizer = keras.optimizers.SGD(0.01)

            def replica_step():
                with tf.GradientTape() as tape:
                    loss = loss_fn(labels, peer_model(images, training=True)) / strategy.num_replicas_in_sync
                grads = tape.gradient(loss, peer_model.trainable_variables)
                peer_optimizer.apply_gradients(zip(grads, peer_model.trainable_variables))

            @tf.function
            def peer_step():
                strategy.run(replica_step)

            report("Peer (MultiWorkerMirroredStrategy)", time_steps(peer_step, args, log), hvd.size(), log)
    hvd.shutdown()


if __name__ == "__main__":
    main()
