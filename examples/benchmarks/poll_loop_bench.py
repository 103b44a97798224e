"""How long a small asynchronous allreduce takes when the caller waits for it in different ways.

    hororun -np 2 python examples/benchmarks/poll_loop_bench.py

Every rank runs --calls allreduces of --floats float32 (``allreduce_async`` then the wait) three
ways, taking turns --repeats times: ``synchronize`` at once; ``while not hvd.poll(h): pass`` (a
busy poll, as scripts that overlap their own work with communication write it); and the same loop
with ``time.sleep(1e-4)`` in it, and checks the last result of each. It prints, per way, the median over repeats of the slowest rank's
mean time per call. docs/benchmarks.md ("A caller that polls in a loop") has the results.
"""
import argparse
import statistics
import time

import torch

import horo_torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--floats", type=int, default=1000)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    hvd.init()
    t = torch.ones(args.floats)

    def busy(h):
        while not hvd.poll(h):
            pass

    def sleepy(h):
        while not hvd.poll(h):
            time.sleep(1e-4)

    ways = {"synchronize": lambda h: None, "busy poll": busy, "poll and sleep 0.1 ms": sleepy}
    times = {w: [] for w in ways}
    for _ in range(args.repeats):
        for way, wait in ways.items():
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                h = hvd.allreduce_async(t, name="poll_loop")
                wait(h)
                out = hvd.synchronize(h)
            mean = (time.perf_counter() - start) / args.calls
            if not torch.equal(out, t):  # the average of every rank's ones
                raise SystemExit(f"rank {hvd.rank()}: {way} gave {out[:4].tolist()}..., expected ones")
            times[way].append(hvd.allreduce(torch.tensor([mean]), op=hvd.Max, name="poll_loop.time").item())
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, {args.floats} float32, {args.calls} calls x {args.repeats} repeats; "
              "median of the slowest rank's mean time per call")
        print("| wait | time per call |\n|---|---:|")
        for way, values in times.items():
            print(f"| {way} | {statistics.median(values) * 1e3:.3f} ms |")
    hvd.shutdown()


if __name__ == "__main__":
    main()
