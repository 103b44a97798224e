"""Flat against hierarchical allreduce (or allgather) with ranks on emulated hosts, in one run.

Every rank sets ``HORO_HOSTNAME`` from its rank before ``init`` (ranks 0..np/hosts-1 on the first
host, and so on), so ranks of one "host" talk through shared memory and ranks of different hosts
through TCP on 127.0.0.1. Jobs alternate between ``HORO_HIERARCHICAL_ALLREDUCE=0`` (flat) and the
default (hierarchical once a set spans hosts), the order rotating with the repeat, so that drift in
the machine's load hits both alike. In a job every rank times each allreduce of a float32 tensor
(same name every time, so the response cache answers negotiation) after warm-up and keeps the
median; the job's value is the slowest rank's median, and the table shows the median over the
repeats, the ratio hierarchical / flat, and the bytes that crossed hosts per allreduce (summed
over ranks, from ``Runtime.stats()``). ``--collective allgather`` does the same for allgather
(``HORO_HIERARCHICAL_ALLGATHER``): a size is the gathered result, each rank contributing 1/np of it.

On one machine "hosts" differ only in shared memory against TCP loopback, which is far faster than
a real network, so the gains here understate those between real hosts. On a small shared machine
the timings are noisy: compare ratios from the same run only.

    python examples/benchmarks/hierarchical_bench.py                  # 4 ranks on 2 hosts
    python examples/benchmarks/hierarchical_bench.py -np 6 --hosts 2 --sizes 64K,4M
    python examples/benchmarks/hierarchical_bench.py --variants       # also the C++ design variants
    python examples/benchmarks/hierarchical_bench.py --collective allgather

``--variants`` compiles and runs ``allreduce_variants.cc``: the hierarchical algorithm against the
leader-based variant and the flat ring, and one against two ring channels on shared memory.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce_bench import format_size, parse_size  # noqa: E402  (the sibling script's helpers)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def format_time(seconds):
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


ALGORITHMS = {"allreduce": ("recursive_doubling", "ring", "hierarchical"), "allgather": ("ring", "hierarchical")}


def worker(sizes, hosts, seconds_per_size, collective="allreduce"):
    """One rank of a job: returns {size: (median seconds, bytes sent to other hosts per call,
    algorithm counts per call)}."""
    import numpy as np

    from horo_core import basics
    from horo_core import numpy_ops as ops

    rank, size = int(os.environ["HORO_RANK"]), int(os.environ["HORO_SIZE"])
    # Horovod's name too: the launcher mirrors HORO_HOSTNAME into it, and init warns when they differ.
    os.environ["HORO_HOSTNAME"] = os.environ["HOROVOD_HOSTNAME"] = f"emulated-host-{rank * hosts // size}"
    basics.init()
    rt = basics.runtime()
    out = {}
    for nbytes in sizes:
        gather = collective == "allgather"
        x = np.ones(nbytes // 4 // (size if gather else 1), dtype=np.float32)
        name = f"bench.{nbytes}"
        call = ops.allgather if gather else ops.allreduce
        start = time.perf_counter()
        for _ in range(3):  # warm-up: connections, caches, page faults
            call(rt, x, name)
        per_call = (time.perf_counter() - start) / 3
        # Every rank must run the same number of iterations: derive it from rank 0's estimate.
        estimate = ops.broadcast(rt, np.array([per_call]), 0, f"bench.estimate.{nbytes}")[0]
        iterations = int(max(5, min(500, seconds_per_size / max(estimate, 1e-6))))
        before = rt.stats()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            call(rt, x, name)
            times.append(time.perf_counter() - start)
        after = rt.stats()
        algorithms = {a: (getattr(after, f"{collective}_{a}") - getattr(before, f"{collective}_{a}")) / iterations
                      for a in ALGORITHMS[collective]}
        cross = (after.bytes_sent_other_hosts - before.bytes_sent_other_hosts) / iterations
        out[nbytes] = (statistics.median(times), cross, algorithms)
    ops.barrier(rt)
    basics.shutdown()
    return out


def run_jobs(args, sizes):
    import horo_runner

    modes = {"flat": "0", "hierarchical": "auto"}
    values = {mode: {s: [] for s in sizes} for mode in modes}
    cross = {mode: {} for mode in modes}
    algorithms = {mode: {} for mode in modes}
    for repeat in range(args.repeats):
        order = list(modes) if repeat % 2 == 0 else list(reversed(modes))
        for mode in order:
            reports = horo_runner.run(worker, args=(sizes, args.hosts, args.seconds, args.collective), num_proc=args.np,
                                      env={f"HORO_HIERARCHICAL_{args.collective.upper()}": modes[mode]})
            for s in sizes:
                values[mode][s].append(max(r[s][0] for r in reports))
                cross[mode][s] = sum(r[s][1] for r in reports)
                algorithms[mode][s] = max(reports[0][s][2], key=reports[0][s][2].get)
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    print(f"\n{args.collective}: {args.np} ranks on {args.hosts} emulated hosts, {args.repeats} repeats "
          f"(median of per-job values; lower is better)")
    print(f"{'size':>8} {'flat':>11} {'hierarchical':>13} {'ratio':>7}   {'cross-host bytes/call':>23}   algorithms")
    for s in sizes:
        flat = statistics.median(values["flat"][s])
        hier = statistics.median(values["hierarchical"][s])
        print(f"{format_size(s):>8} {format_time(flat):>11} {format_time(hier):>13} {hier / flat:>7.2f}   "
              f"{int(cross['flat'][s]):>11} {int(cross['hierarchical'][s]):>11}   "
              f"{algorithms['flat'][s]} / {algorithms['hierarchical'][s]}")


def run_variants(args):
    with tempfile.TemporaryDirectory(prefix="horo-variants-") as workdir:
        exe = os.path.join(workdir, "allreduce_variants")
        build_variants(exe)
        subprocess.run([exe, str(args.variants_max_mb), str(args.seconds)], check=True)


def build_variants(exe):
    src = os.path.join(ROOT, "horo_core", "src")
    sources = [os.path.join(HERE, "allreduce_variants.cc")]
    for folder in ("collectives", "transport/tcp", "transport/shm", "common"):
        path = os.path.join(src, folder)
        sources += sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".cc"))
    subprocess.run(["g++", "-std=c++17", "-O3", "-pthread", "-I", src, "-I", os.path.join(ROOT, "horo_core", "include"),
                    *sources, "-o", exe], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts (default 2)")
    p.add_argument("--sizes", default="4K,64K,256K,1M,4M,16M", help="comma-separated message sizes")
    p.add_argument("--repeats", type=int, default=3, help="jobs per mode (default 3)")
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per size and job (default 1)")
    p.add_argument("--collective", choices=sorted(ALGORITHMS), default="allreduce",
                   help="collective to time (default allreduce); allgather sizes are the gathered result")
    p.add_argument("--variants", action="store_true", help="also run the C++ design variants")
    p.add_argument("--variants-max-mb", type=int, default=64, help="largest size of the variants (default 64)")
    args = p.parse_args()
    if args.hosts < 2 or args.np < args.hosts:
        p.error("need at least 2 hosts and at least one rank per host")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    unit = 4 * (args.np if args.collective == "allgather" else 1)
    if any(s % unit or s <= 0 for s in sizes):
        p.error(f"sizes must be positive multiples of {unit} bytes (float32{' per rank' if unit > 4 else ''})")
    run_jobs(args, sizes)
    if args.variants:
        run_variants(args)


if __name__ == "__main__":
    main()
