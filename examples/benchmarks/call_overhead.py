"""Where one small synchronous allreduce spends its time on a single rank, layer by layer.

    python examples/benchmarks/call_overhead.py
    python examples/benchmarks/call_overhead.py --bytes 4096 --calls 100000

Times three loops over the same prepared 4-byte (or --bytes) allreduce, each the best of --repeats
runs of --calls calls:

* ``hvd.allreduce_(t, op=Sum, name=...)``: what a user pays (the adapter's checks included);
* ``Runtime.run_prepared``: the core call through the Python wrapper that guards against shutdown;
* ``lib.horo_run_at`` straight through cffi: the core alone (enqueue, negotiation with the peer
  agreement, the reduction, the handle), plus the cffi call itself.

With one rank there is no peer to wait for, so the three numbers are CPU time per call; on a shared
core every rank pays them once per collective (docs/benchmarks.md, "A leaner core path").
"""
import argparse
import time

import torch

import horo_torch as hvd
from horo_core import basics
from horo_core._binding import lib


def best_per_call(loop, calls, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        loop(calls)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=4, help="tensor size in bytes, a multiple of 4 (default 4)")
    p.add_argument("--calls", type=int, default=200000, help="calls per timed run (default 200000)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per loop; the best counts (default 5)")
    args = p.parse_args()
    if args.bytes <= 0 or args.bytes % 4:
        p.error("--bytes must be a positive multiple of 4")

    hvd.init()
    if hvd.size() != 1:
        raise SystemExit("call_overhead.py measures one rank: run it without a launcher")
    t = torch.ones(args.bytes // 4)
    name = "call_overhead"
    hvd.allreduce_(t, op=hvd.Sum, name=name)
    # The description allreduce_ prepared for this name, reused by the two lower loops.
    from horo_torch import _allreduce_ops
    prepared = _allreduce_ops._last_allreduce[name][-1]
    runtime = basics.runtime()
    address = t.data_ptr()

    def adapter(n):
        for _ in range(n):
            hvd.allreduce_(t, op=hvd.Sum, name=name)

    def wrapper(n):
        for _ in range(n):
            runtime.run_prepared(prepared, address, address)

    def core(n):
        rt, op_type, tensor, options, run_at = runtime._rt, prepared.op_type, prepared.tensor, prepared.options, \
            lib.horo_run_at
        for _ in range(n):
            if run_at(rt, op_type, tensor, address, address, options) != lib.HORO_OK:
                raise SystemExit("horo_run_at failed")

    rows = [("hvd.allreduce_", adapter), ("Runtime.run_prepared", wrapper), ("lib.horo_run_at (cffi)", core)]
    for label, loop in rows:
        loop(min(args.calls, 20000))  # warm-up
        print(f"{label:24s} {best_per_call(loop, args.calls, args.repeats):6.2f} us per call", flush=True)
    # One rank's sum is the tensor itself, however many calls ran.
    if not bool((t == 1).all()):
        raise SystemExit(f"allreduce changed the tensor: {t[:4].tolist()}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
