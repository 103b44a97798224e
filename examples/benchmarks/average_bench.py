"""Average against Sum on a training step's worth of gradients: what the division costs.

    hororun -np 2 python examples/benchmarks/average_bench.py

Every round starts one in-place ``allreduce_async_`` per tensor (by default 48 float32 tensors of
720x720, 2 MB each: the layers of pytorch_synthetic_benchmark.py) and then synchronizes them all,
as DistributedOptimizer does in a step. Rank 0 prints, for each op, the median round time of the
slowest rank after the warm-up rounds. The result of the last round is checked against the exact
average or sum of the ranks' inputs.
"""
import argparse
import statistics
import time

import torch

import horo_torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors", type=int, default=48, help="tensors per round (default 48)")
    p.add_argument("--elements", type=int, default=720 * 720, help="float32 elements per tensor (default 518400)")
    p.add_argument("--rounds", type=int, default=25, help="rounds per op (default 25)")
    p.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    args = p.parse_args()
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    tensors = [torch.empty(args.elements) for _ in range(args.tensors)]
    megabytes = args.tensors * args.elements * 4 / 1e6
    for op, label in ((hvd.Average, "Average"), (hvd.Sum, "Sum")):
        times = []
        for _ in range(args.warmup + args.rounds):
            for t in tensors:
                t.fill_(r + 1.0)  # small integers: the sums and averages are exact
            hvd.barrier()
            start = time.perf_counter()
            handles = [hvd.allreduce_async_(t, op=op, name=f"{label}.{i}") for i, t in enumerate(tensors)]
            for h in handles:
                hvd.synchronize(h)
            times.append(time.perf_counter() - start)
        total = n * (n + 1) / 2
        want = total / n if op == hvd.Average else total
        if any(not torch.all(t == want) for t in tensors):
            raise SystemExit(f"rank {r}: {label} gave a wrong result (expected {want})")
        median = statistics.median(times[args.warmup:])
        slowest = hvd.allreduce(torch.tensor([median]), op=hvd.Max, name=f"median.{label}").item()
        if r == 0:
            print(f"{label}: {slowest * 1e3:.2f} ms per round of {args.tensors} tensors ({megabytes:.1f} MB), "
                  f"{n} ranks", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
