"""TF1-style data-parallel training (a graph run by ``session.run``) on scikit-learn's digits.

    hororun -np 2 python examples/tensorflow/tensorflow1_digits.py

The shape of Horovod's examples/tensorflow/tensorflow_mnist.py, with Horo's import: a
``tf.compat.v1.train`` optimizer wrapped by ``hvd.DistributedOptimizer`` (gradients averaged across
ranks), ``hvd.BroadcastGlobalVariablesHook(0)`` (rank 0's initial values, or its restored
checkpoint, on every rank), a ``MonitoredTrainingSession`` that checkpoints on rank 0 only, and the
test accuracy averaged over the ranks' test shards with ``hvd.allreduce`` in the same graph. The data
ships with scikit-learn, so nothing is downloaded.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import horo_tf as hvd  # noqa: E402

v1 = tf.compat.v1


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps of the whole job")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.001, help="learning rate of one rank")
    parser.add_argument("--checkpoint-dir", default=None, help="rank 0 saves checkpoints here (and resumes)")
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="exit with status 1 below this")
    return parser.parse_args()


def dense(inputs, units, name, activation=None):
    with v1.variable_scope(name):
        w = v1.get_variable("kernel", [inputs.shape[-1], units], initializer=v1.glorot_uniform_initializer())
        b = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
    out = tf.matmul(inputs, w) + b
    return activation(out) if activation else out


def batches(x, y, size, seed):
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(x) - size + 1, size):
            chosen = order[start:start + size]
            yield x[chosen], y[chosen]


def main():
    args = parse_args()
    v1.disable_v2_behavior()
    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    shard = slice(hvd.rank(), None, hvd.size())

    v1.set_random_seed(hvd.rank())  # different on purpose: the hook's broadcast makes them equal
    images = v1.placeholder(tf.float32, [None, 64], name="images")
    labels = v1.placeholder(tf.int64, [None], name="labels")
    hidden = dense(images, 128, "hidden", tf.nn.relu)
    logits = dense(hidden, 10, "logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    # Built before the optimizer: the training step's reduction waits on it (each step averages the
    # batch's accuracy too, 4 bytes), and run alone on the test set it runs nothing of the step.
    mean_accuracy = hvd.allreduce(accuracy, op=hvd.Average)

    # Horovod: scale the learning rate by the number of ranks, and average the gradients.
    opt = hvd.DistributedOptimizer(v1.train.AdamOptimizer(args.lr * hvd.size()))
    global_step = v1.train.get_or_create_global_step()
    train_op = opt.minimize(loss, global_step=global_step)

    hooks = [hvd.BroadcastGlobalVariablesHook(0)]
    checkpoint_dir = args.checkpoint_dir if hvd.rank() == 0 else None
    steps = args.steps // hvd.size()
    data = batches(x_train[shard], y_train[shard], args.batch_size, seed=hvd.rank())
    # log_step_count_steps=None: no steps/s counter, whose check that every run moves the global
    # step warns about the runs that read it or evaluate (it would on one process too).
    with v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks,
                                           log_step_count_steps=None) as session:
        done = session.run(global_step)
        for _ in range(done, steps):
            xb, yb = next(data)
            _, step, value = session.run([train_op, global_step, loss], {images: xb, labels: yb})
            if hvd.rank() == 0 and step % 100 == 0:
                print(f"step {step}: loss {value:.4f}", flush=True)
        test_accuracy = session.run(mean_accuracy, {images: x_test[shard], labels: y_test[shard]})
    if hvd.rank() == 0:
        print(f"test accuracy (mean over {hvd.size()} ranks' shards): {test_accuracy:.4f}", flush=True)
    if test_accuracy < args.min_accuracy:
        raise SystemExit(f"rank {hvd.rank()}: test accuracy {test_accuracy:.4f} is below --min-accuracy "
                         f"{args.min_accuracy}")


if __name__ == "__main__":
    main()
