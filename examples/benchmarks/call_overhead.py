"""Where one small synchronous allreduce spends its time, layer by layer, on one rank or several.

    python examples/benchmarks/call_overhead.py
    python examples/benchmarks/call_overhead.py --bytes 4096 --calls 100000
    hororun -np 4 python examples/benchmarks/call_overhead.py --calls 3000 --repeats 20

Times six loops over the same prepared 4-byte (or --bytes) allreduce (op Max, so that the tensor
keeps its value however many calls run):

* ``hvd.allreduce_(t, op=Max, name=...)``: what a user pays (the adapter's checks included);
* ``hvd.allreduce_.__wrapped__``: the same without the wrapper that looks for torch.compile
  (horo_torch/_compile.py);
* ``Runtime.run_prepared``: the core call through the Runtime's Python method (what the adapters'
  other synchronous calls use);
* the bound run that ``allreduce_`` calls (``Runtime.bind_run``: a ``functools.partial`` of
  ``lib.horo_run_read``, which reads the tensor in the core, given its ``_cdata``), without the
  adapter's checks of its other arguments;
* ``lib.horo_run_at`` plus the five reads of the tensor that the adapter makes per call (dtype,
  shape, device, layout, address), without the rest of the adapter;
* ``lib.horo_run_at`` straight through cffi: the core alone (enqueue, negotiation with the peer
  agreement, the reduction, the handle), plus the cffi call itself.

With one rank there is no peer to wait for, so the numbers are CPU time per call, each the best of
--repeats runs of --calls calls. With several ranks the loops take turns within each repeat, every
rank runs the same loop at the same time, and a loop's number is the median over the repeats of the
slowest rank's time per call. On a host with more ranks than cores every rank pays its per-call
work in turn (docs/benchmarks.md, "Per-call work on a shared core").
"""
import argparse
import statistics
import time

import torch

import horo_torch as hvd
from horo_core import basics
from horo_core._binding import lib


def per_call(loop, calls):
    start = time.perf_counter()
    loop(calls)
    return (time.perf_counter() - start) / calls * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=4, help="tensor size in bytes, a multiple of 4 (default 4)")
    p.add_argument("--calls", type=int, default=200000, help="calls per timed run (default 200000)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per loop (default 5)")
    args = p.parse_args()
    if args.bytes <= 0 or args.bytes % 4:
        p.error("--bytes must be a positive multiple of 4")

    hvd.init()
    t = torch.ones(args.bytes // 4)
    name = "call_overhead"
    hvd.allreduce_(t, op=hvd.Max, name=name)
    # The run allreduce_ bound for this name, and its description, reused by the lower loops.
    from horo_torch import _allreduce_ops
    bound = _allreduce_ops._last_allreduce[name][-1]
    prepared = bound.prepared
    runtime = basics.runtime()
    address = t.data_ptr()
    rt, op_type, tensor, options, run_at = runtime._rt, prepared.op_type, prepared.tensor, prepared.options, \
        lib.horo_run_at
    dtype, shape = t.dtype, t.shape

    def adapter(n):
        for _ in range(n):
            hvd.allreduce_(t, op=hvd.Max, name=name)

    bare = hvd.allreduce_.__wrapped__

    def unwrapped(n):
        for _ in range(n):
            bare(t, op=hvd.Max, name=name)

    def wrapper(n):
        for _ in range(n):
            runtime.run_prepared(prepared, address, address)

    def bound_run(n):
        for _ in range(n):
            impl = t._cdata
            if bound(impl, impl) != lib.HORO_OK:
                raise SystemExit("the bound run failed")

    def core_and_reads(n):
        for _ in range(n):
            if not (t.dtype is dtype and t.shape == shape and t.is_cpu and t.is_contiguous()):
                raise SystemExit("the tensor changed")
            at = t.data_ptr()
            if run_at(rt, op_type, tensor, options, at, at) != lib.HORO_OK:
                raise SystemExit("horo_run_at failed")

    def core(n):
        for _ in range(n):
            if run_at(rt, op_type, tensor, options, address, address) != lib.HORO_OK:
                raise SystemExit("horo_run_at failed")

    rows = [("hvd.allreduce_", adapter), ("hvd.allreduce_ unwrapped", unwrapped), ("Runtime.run_prepared", wrapper),
            ("bound run", bound_run), ("lib.horo_run_at + reads", core_and_reads), ("lib.horo_run_at (cffi)", core)]
    for _, loop in rows:
        loop(min(args.calls, 20000))  # warm-up
    times = {label: [] for label, _ in rows}
    for _ in range(args.repeats):
        for label, loop in rows:
            times[label].append(per_call(loop, args.calls))
    n = hvd.size()
    for label, _ in rows:
        if n == 1:
            value = min(times[label])
        else:
            slowest = hvd.allreduce(torch.tensor(times[label], dtype=torch.float64), op=hvd.Max,
                                    name=f"call_overhead.{label}")
            value = statistics.median(slowest.tolist())
        if hvd.rank() == 0:
            print(f"{label:24s} {value:6.2f} us per call", flush=True)
    if n > 1 and hvd.rank() == 0:
        print(f"({n} ranks: median over {args.repeats} repeats of the slowest rank)", flush=True)
    # Every rank's tensor held ones: their maximum is ones, however many calls ran.
    if not bool((t == 1).all()):
        raise SystemExit(f"allreduce changed the tensor: {t[:4].tolist()}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
