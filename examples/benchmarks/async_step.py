"""Per-tensor cost of the asynchronous path DistributedOptimizer takes for every gradient.

    python examples/benchmarks/async_step.py                  # one rank
    hororun -np 2 python examples/benchmarks/async_step.py

A step enqueues --tensors named in-place allreduces (``hvd.allreduce_async_``, op Average) of
--elements float32 elements each, then waits for each (``hvd.synchronize``), as a training step's
hooks and ``optimizer.step()`` do. Rank 0 prints the best of --repeats runs of --steps steps, per
step and per tensor, after checking the values once.
"""
import argparse
import time

import torch

import horo_torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors", type=int, default=98, help="tensors per step (default 98, ResNet-50's count)")
    p.add_argument("--elements", type=int, default=1000, help="float32 elements per tensor (default 1000)")
    p.add_argument("--steps", type=int, default=100, help="steps per timed run (default 100)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs; the best counts (default 5)")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first (default 30)")
    args = p.parse_args()

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    tensors = [torch.full((args.elements,), float(r + 1)) for _ in range(args.tensors)]
    names = [f"async_step.{i}" for i in range(args.tensors)]

    def step():
        handles = [hvd.allreduce_async_(t, name=name, op=hvd.Average) for t, name in zip(tensors, names)]
        for h in handles:
            hvd.synchronize(h)

    step()
    # The average of 1..n, then averages of equal values: unchanged by every later step.
    want = (n + 1) / 2
    if not all(bool((t == want).all()) for t in tensors):
        raise SystemExit(f"rank {r}: allreduce_async_ gave {tensors[0][0].item()}, expected {want}")
    for _ in range(args.warmup):
        step()
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        best = min(best, (time.perf_counter() - start) / args.steps)
    slowest = hvd.allreduce(torch.tensor([best], dtype=torch.float64), op=hvd.Max, name="async_step.time")
    if r == 0:
        per_step = slowest.item()
        print(f"{n} ranks: {per_step * 1e3:.2f} ms per step of {args.tensors} async allreduces, "
              f"{per_step / args.tensors * 1e6:.1f} us per tensor", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
