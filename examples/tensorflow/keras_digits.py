"""Data-parallel Keras 3 training on scikit-learn's digits (8x8 images, 10 classes).

    hororun -np 2 python examples/tensorflow/keras_digits.py

Each rank trains on its shard of the training set; the optimizer averages gradients across ranks,
the callbacks broadcast rank 0's initial state, warm the learning rate up to size * base rate and
average the epoch metrics. Rank 0 reports the test accuracy. The data ships with scikit-learn, so
nothing is downloaded.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import horo_tf.keras as hvd  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="learning rate of one rank")
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="exit with status 1 below this")
    return parser.parse_args()


def main():
    args = parse_args()
    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    x_shard, y_shard = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast makes them equal
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    scaled_lr = args.lr * hvd.size()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.LearningRateWarmupCallback(scaled_lr, warmup_epochs=args.warmup_epochs, verbose=1),
        hvd.callbacks.MetricAverageCallback(),
    ]
    model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
              validation_data=(x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]),
              verbose=2 if hvd.rank() == 0 else 0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        print(f"test accuracy: {accuracy:.4f} ({len(x_test)} images, {hvd.size()} ranks)")
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        print(f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
