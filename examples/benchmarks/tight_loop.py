"""Per-call time of a loop of synchronous allreduces of one small tensor, the pattern of a metric
averaged every step: what a caller pays per collective when nothing else is in flight.

    hororun -np 2 python examples/benchmarks/tight_loop.py            # 4-byte tensor
    hororun -np 4 python examples/benchmarks/tight_loop.py --bytes 4096
    hororun -np 2 python examples/benchmarks/tight_loop.py --out-of-place
    HORO_CALLER_PROGRESS=0 hororun -np 2 python examples/benchmarks/tight_loop.py

Every rank times --blocks blocks of --calls calls of ``hvd.allreduce_(t, op=Sum, name=...)`` (or,
with ``--out-of-place``, ``hvd.allreduce``, which returns a new tensor) after a warm-up; rank 0
prints the per-call time of every block of the slowest rank and their median, then what a call
cost on average over the ranks: rounds of the agreement between the ranks, passes the caller ran,
waits in which it busy-polled before yielding, yields of its core, and times the calling thread was
switched out while runnable (its core given to another rank).
The result is checked against the exact sum once.

``--one-core`` pins every rank to the first CPU of the launcher's set, the most oversubscribed
case: each call then needs a switch between ranks, and what a rank does per call is paid in turn.
"""
import argparse
import os
import resource
import statistics
import time

import torch

import horo_torch as hvd
from horo_core import basics

RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", 1)  # Linux: this thread only


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=4, help="tensor size in bytes, a multiple of 4 (default 4)")
    p.add_argument("--calls", type=int, default=3000, help="calls per timed block (default 3000)")
    p.add_argument("--blocks", type=int, default=7, help="timed blocks (default 7)")
    p.add_argument("--warmup", type=int, default=2000, help="untimed calls first (default 2000)")
    p.add_argument("--out-of-place", action="store_true",
                   help="time hvd.allreduce (a new tensor per call) instead of hvd.allreduce_")
    p.add_argument("--one-core", action="store_true", help="pin every rank to one CPU (before init)")
    args = p.parse_args()
    if args.bytes <= 0 or args.bytes % 4:
        p.error("--bytes must be a positive multiple of 4")
    if args.one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the runtime's threads inherit it

    hvd.init()
    n = hvd.size()
    t = torch.full((args.bytes // 4,), float(hvd.rank() + 1))
    call = hvd.allreduce if args.out_of_place else hvd.allreduce_
    got = call(t, op=hvd.Sum, name="tight")
    expected = float(n * (n + 1) // 2)
    if not bool((got == expected).all()):
        raise SystemExit(f"rank {hvd.rank()}: allreduce gave {got[0].item()}, expected {expected}")
    for _ in range(args.warmup):
        call(t, op=hvd.Sum, name="tight")
    blocks = []
    stats_before, usage_before = basics.runtime().stats(), resource.getrusage(RUSAGE_THREAD)
    for _ in range(args.blocks):
        start = time.perf_counter()
        for _ in range(args.calls):
            call(t, op=hvd.Sum, name="tight")
        blocks.append((time.perf_counter() - start) / args.calls)
    stats_after, usage_after = basics.runtime().stats(), resource.getrusage(RUSAGE_THREAD)
    timed_calls = args.blocks * args.calls
    costs = torch.tensor([stats_after.rounds_agreed - stats_before.rounds_agreed,
                          stats_after.passes_by_callers - stats_before.passes_by_callers,
                          stats_after.caller_polls - stats_before.caller_polls,
                          stats_after.caller_yields - stats_before.caller_yields,
                          usage_after.ru_nivcsw - usage_before.ru_nivcsw], dtype=torch.float64) / timed_calls
    # The slowest rank sets the pace: take every block's maximum over the ranks.
    slowest = hvd.allreduce(torch.tensor(blocks, dtype=torch.float64), op=hvd.Max, name="tight.times")
    costs = hvd.allreduce(costs, op=hvd.Average, name="tight.costs")
    if hvd.rank() == 0:
        per_call = [f"{s * 1e6:.1f}" for s in slowest.tolist()]
        print(f"{n} ranks, {args.bytes} B: per-call us {' '.join(per_call)}; "
              f"median {statistics.median(slowest.tolist()) * 1e6:.1f} us", flush=True)
        rounds, passes, polls, yields, switches = costs.tolist()
        print(f"per call, mean over ranks: {rounds:.2f} rounds, {passes:.2f} caller passes, {polls:.2f} polls, "
              f"{yields:.2f} yields, {switches:.2f} involuntary switches", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
