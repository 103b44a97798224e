"""Allreduce of CUDA tensors in one job, on the same float32 data, for every peer that can run:

* ``horo``         horo_torch.allreduce_ on the core path: NCCL when every rank has its own GPU,
                   the core's pinned staging when ranks share one (see horo_torch/device.py);
* ``horo-staged``  the same call with the adapter staging instead (horo_torch.device.CORE_TAKES_CUDA
                   = False): non_blocking copies into pooled pinned buffers, the core on host memory;
* ``gloo``         torch.distributed.all_reduce on a gloo group (CUDA tensors, staged by gloo);
* ``nccl``         torch.distributed.all_reduce on an NCCL group; when it cannot be created (two
                   ranks on one GPU) the error is printed instead of a row.

Three more rows take a staged allreduce apart (none is an allreduce of the CUDA tensor):

* ``copy``         the tensor to a pinned host buffer and back (non_blocking copies on the current
                   stream), no communication: what moving the data costs, every rank at once;
* ``copy-wait``    the same copies, waiting for each to finish before going on (as a staged
                   collective must: the host reduces only what has arrived);
* ``host``         horo_torch.allreduce_ of a CPU tensor of the same size: the host collective alone.

    python examples/benchmarks/cuda_allreduce_bench.py --np 2

Per (peer, size) every rank times blocks of ``--iters`` calls back to back (each block starts at a
barrier and ends with torch.cuda.synchronize()) and keeps the median block's time per call over
``--blocks`` blocks, after one block of warm-up; the job's value is the slowest rank's. (Timing
single calls instead, with a synchronize between them, measures mostly how far apart the ranks
start: with two processes sharing a GPU, waiting for a small copy can take a few hundred
microseconds, see the copy-wait row.) algbw = bytes / time, busbw = algbw *
2(n-1)/n (nccl-tests' definition; 0 for one rank). Each peer's result is checked against the exact
sum once per size before timing.
"""
import argparse
import datetime
import socket
import statistics
import sys
import time

import torch

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def rank_main(sizes, iters, blocks, peers):
    import torch.distributed as dist

    import horo_torch as hvd
    from horo_torch import device as hdevice
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, 0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    groups, notes = {"gloo": dist.group.WORLD}, []
    if "nccl" in peers:
        try:
            nccl_group = dist.new_group(backend="nccl", timeout=datetime.timedelta(seconds=30))
            probe = torch.ones(4, device=dev)
            dist.all_reduce(probe, group=nccl_group)
            torch.cuda.synchronize()
            groups["nccl"] = nccl_group
        except Exception as exc:  # e.g. "Duplicate GPU detected" with two ranks on one GPU
            notes.append(f"torch nccl group failed on rank {rank}: {type(exc).__name__}: {str(exc)[:400]}")

    pinned, host = {}, {}

    def run_once(peer, x, size):
        if peer in ("copy", "copy-wait"):
            if size not in pinned:
                pinned[size] = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            pinned[size].copy_(x, non_blocking=True)
            if peer == "copy-wait":
                torch.cuda.current_stream().synchronize()
            x.copy_(pinned[size], non_blocking=True)
            if peer == "copy-wait":
                torch.cuda.current_stream().synchronize()
        elif peer == "host":
            if size not in host:  # filled once: later sums grow, which costs nothing extra
                host[size] = torch.ones(x.shape, dtype=x.dtype)
            hvd.allreduce_(host[size], op=hvd.Sum, name=f"host.{size}")
        elif peer in ("horo", "horo-staged"):
            hdevice.CORE_TAKES_CUDA = peer == "horo"
            hvd.allreduce_(x, op=hvd.Sum, name=f"{peer}.{size}")
        else:
            dist.all_reduce(x, group=groups[peer])

    rows = []
    for size in sizes:
        x = torch.empty(size // 4, dtype=torch.float32, device=dev)
        for peer in peers:
            if peer in ("gloo", "nccl") and peer not in groups:
                continue
            x.fill_(rank + 1)
            host.pop(size, None)  # the check call starts the host row from ones
            run_once(peer, x, size)
            torch.cuda.synchronize()
            got = host[size] if peer == "host" else x  # the host row reduces a CPU tensor of ones
            want = {"copy": rank + 1.0, "copy-wait": rank + 1.0, "host": float(n)}.get(peer, n * (n + 1) / 2)
            if not torch.equal(got, torch.full_like(got, want)):
                raise AssertionError(f"{peer} {size} B: wrong result {got[:4].tolist()}")
            times = []
            for block in range(blocks + 1):  # the first block warms up
                x.fill_(1.0)
                torch.cuda.synchronize()
                hvd.barrier()  # every rank starts the block together
                start = time.perf_counter()
                for _ in range(iters):
                    run_once(peer, x, size)
                torch.cuda.synchronize()
                if block > 0:
                    times.append((time.perf_counter() - start) / iters)
            mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
            slowest = hvd.allreduce(mine, op=hvd.Max, name=f"time.{peer}.{size}").item()
            rows.append((peer, size, slowest))
    hdevice.CORE_TAKES_CUDA = True
    info = {"rank": rank, "n": n, "rows": rows, "notes": notes, "nccl_built": hvd.nccl_built()}
    dist.destroy_process_group()
    hvd.shutdown()
    return info


def main():
    parser = argparse.ArgumentParser(description="Allreduce of CUDA tensors: Horo against torch.distributed "
                                                 "(NCCL, gloo) and plain copies, in one job.")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10, help="calls per timed block")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per (peer, size); the median counts")
    parser.add_argument("--peers", default="horo,horo-staged,gloo,nccl,copy,copy-wait,host")
    parser.add_argument("--sizes", default=",".join(f"{s >> 10}K" for s in SIZES),
                        help="comma-separated sizes in bytes, with K or M suffixes")
    args = parser.parse_args()
    sizes = [int(v[:-1]) << {"K": 10, "M": 20}[v[-1]] if v[-1] in "KM" else int(v) for v in args.sizes.split(",")]
    if not torch.cuda.is_available():
        sys.exit("cuda_allreduce_bench: no CUDA GPU is visible (torch.cuda.is_available() is False)")
    import horo_runner
    results = horo_runner.run(rank_main, args=(sizes, args.iters, args.blocks, args.peers.split(",")),
                              num_proc=args.np)
    n = results[0]["n"]
    for r in results:
        for note in r["notes"]:
            print(note)
    print(f"np={n}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else '?'}, "
          f"NCCL {results[0]['nccl_built']}, median of {args.blocks} blocks of {args.iters} calls, slowest rank")
    print("| peer | size | time (us) | algbw (GB/s) | busbw (GB/s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for peer, size, seconds in results[0]["rows"]:
        algbw = size / seconds / 1e9
        print(f"| {peer} | {size >> 10} KiB | {seconds * 1e6:.1f} | {algbw:.2f} | {algbw * 2 * (n - 1) / n:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
