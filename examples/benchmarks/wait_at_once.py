"""A small allreduce waited for at once, through each of horo_torch's entry points.

    python examples/benchmarks/wait_at_once.py                 # one rank
    hororun -np 2 python examples/benchmarks/wait_at_once.py

Loops of --calls named allreduces (op Sum) of --elements float32 elements: ``allreduce_``,
``allreduce``, ``allreduce_async_`` + ``synchronize`` and ``allreduce_async`` + ``synchronize``,
taking turns within each of --repeats repeats. Rank 0 prints, per entry point, the median over the
repeats of the slowest rank's time per call, after checking that every result is the sum, and the
passes the background thread ran per call (the most of any rank, over all repeats): a caller that
waits at once runs its collective itself, so they should stay near 0.
"""
import argparse
import statistics
import time

import torch

import horo_torch as hvd
from horo_core import basics


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elements", type=int, default=16, help="float32 elements per tensor (default 16)")
    p.add_argument("--calls", type=int, default=3000, help="calls per timed loop (default 3000)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    args = p.parse_args()

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = float(n * (n + 1) // 2)
    x = torch.full((args.elements,), float(r + 1))
    entry_points = {
        "allreduce_": lambda: hvd.allreduce_(x.clone(), name="wait.in_place", op=hvd.Sum),
        "allreduce": lambda: hvd.allreduce(x, name="wait.copy", op=hvd.Sum),
        "allreduce_async_ + synchronize": lambda: hvd.synchronize(
            hvd.allreduce_async_(x.clone(), name="wait.async_in_place", op=hvd.Sum)),
        "allreduce_async + synchronize": lambda: hvd.synchronize(
            hvd.allreduce_async(x, name="wait.async_copy", op=hvd.Sum)),
    }
    for label, call in entry_points.items():
        got = call()
        if not bool((got == total).all()):
            raise SystemExit(f"{label}: got {got[:4].tolist()}, want {total}")
    times = {label: [] for label in entry_points}
    background = dict.fromkeys(entry_points, 0)
    runtime = basics.runtime()
    for _ in range(args.repeats):
        for label, call in entry_points.items():
            hvd.barrier()
            passes = runtime.stats().passes_by_background
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            times[label].append((time.perf_counter() - start) / args.calls * 1e6)
            background[label] += runtime.stats().passes_by_background - passes
    for label in entry_points:
        slowest = hvd.allreduce(torch.tensor(times[label] + [background[label]], dtype=torch.float64), op=hvd.Max,
                                name=f"wait.{label}").tolist()
        if r == 0:
            print(f"{label:32s} {statistics.median(slowest[:-1]):7.1f} us per call, "
                  f"{slowest[-1] / (args.calls * args.repeats):.3f} background passes per call", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
