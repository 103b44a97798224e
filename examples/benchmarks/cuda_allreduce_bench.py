"""Allreduce of CUDA tensors in one job, on the same float32 data, for every peer that can run:

* ``horo``         horo_torch.allreduce_ on the core path: NCCL when every rank has its own GPU,
                   the core's pinned staging when ranks share one (see horo_torch/device.py);
* ``horo-staged``  the same call with the adapter staging instead (horo_torch.device.CORE_TAKES_CUDA
                   = False): non_blocking copies into pooled pinned buffers, the core on host memory;
* ``gloo``         torch.distributed.all_reduce on a gloo group (CUDA tensors, staged by gloo);
* ``nccl``         torch.distributed.all_reduce on an NCCL group; when it cannot be created (two
                   ranks on one GPU) the error is printed instead of a row.

    python examples/benchmarks/cuda_allreduce_bench.py --np 2

Per (peer, size) every rank times each iteration alone (the tensor is refilled and the device
synchronised outside the timed region; the timed region ends with torch.cuda.synchronize()) and
keeps the median; the job's value is the slowest rank's. algbw = bytes / time, busbw = algbw *
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


def rank_main(sizes, iters, peers):
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

    def run_once(peer, x, size):
        if peer in ("horo", "horo-staged"):
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
            run_once(peer, x, size)
            torch.cuda.synchronize()
            if not torch.equal(x[:1024].cpu(), torch.full((min(1024, x.numel()),), n * (n + 1) / 2)):
                raise AssertionError(f"{peer} {size} B: wrong result {x[:4].tolist()}")
            times = []
            for i in range(iters + 2):
                x.fill_(1.0)
                torch.cuda.synchronize()
                start = time.perf_counter()
                run_once(peer, x, size)
                torch.cuda.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - start)
            mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
            slowest = hvd.allreduce(mine, op=hvd.Max, name=f"time.{peer}.{size}").item()
            rows.append((peer, size, slowest))
    hdevice.CORE_TAKES_CUDA = True
    info = {"rank": rank, "n": n, "rows": rows, "notes": notes, "nccl_built": hvd.nccl_built()}
    dist.destroy_process_group()
    hvd.shutdown()
    return info


def main():
    parser = argparse.ArgumentParser(description="Allreduce of CUDA tensors: Horo vs torch.distributed")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--peers", default="horo,horo-staged,gloo,nccl")
    args = parser.parse_args()
    import horo_runner
    results = horo_runner.run(rank_main, args=(SIZES, args.iters, args.peers.split(",")), np=args.np)
    n = results[0]["n"]
    for r in results:
        for note in r["notes"]:
            print(note)
    print(f"np={n}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else '?'}, "
          f"NCCL {results[0]['nccl_built']}, median of {args.iters} iterations, slowest rank")
    print("| peer | size | time (us) | algbw (GB/s) | busbw (GB/s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for peer, size, seconds in results[0]["rows"]:
        algbw = size / seconds / 1e9
        print(f"| {peer} | {size >> 10} KiB | {seconds * 1e6:.1f} | {algbw:.2f} | {algbw * 2 * (n - 1) / n:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
