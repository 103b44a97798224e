"""Synthetic training throughput: Horo's DistributedOptimizer against PyTorch DDP on the same
model, data and ranks, plus the compute-only ceiling (the same steps with no communication).

    hororun -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --peer ddp

Like Horovod's benchmark it trains on the GPU when PyTorch sees one (``--no-cuda`` to stay on the
CPU), rank i on GPU ``local_rank % device_count``; DDP then uses NCCL when every rank of the host
has its own GPU and gloo when ranks share one (NCCL refuses two ranks on one GPU).

The model is a stack of square Linear layers (default 48 x 720: about 25M parameters in 98
tensors). After one untimed round of every mode, every mode runs the same number of timed steps
after warm-up; the modes take turns in each repeat so that drift on a shared machine hits them
alike. Reported: samples/s of the whole job (median over repeats), the ratios Horo/DDP and
Horo/ceiling of those medians, and Horo/ceiling per repeat (both measured within the same repeat,
one after the other without DDP) with its median. At the end the job checks that the modes that
synchronise (Horo, DDP) left the same parameters on every rank.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn as nn

import horo_torch as hvd


def build_model(width, layers):
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=720, help="features of every Linear layer")
    p.add_argument("--layers", type=int, default=48, help="number of width x width layers")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--num-warmup", type=int, default=3, help="untimed steps before each measurement")
    p.add_argument("--num-iters", type=int, default=10, help="timed steps per measurement")
    p.add_argument("--repeats", type=int, default=3, help="measurements per mode (median reported)")
    p.add_argument("--peer", choices=["ddp", "none"], default="ddp", help="also run PyTorch DDP (gloo, or NCCL when every rank has its own GPU)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads per rank (0: cores / local ranks, at least 1)")
    p.add_argument("--fp16-allreduce", action="store_true", help="Horo: compress gradients to float16")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU even when a GPU is available")
    return p.parse_args()


class Mode:
    """One way of training the model: its name and a step function."""

    def __init__(self, name, model, step):
        self.name, self.model, self.step = name, model, step


def make_modes(args, data, target, device):
    loss_fn = nn.CrossEntropyLoss()
    modes = []

    def plain_step(model, optimizer):
        def step():
            optimizer.zero_grad()
            loss_fn(model(data), target).backward()
            optimizer.step()
        return step

    torch.manual_seed(0)
    model = build_model(args.width, args.layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    modes.append(Mode("compute only", model, plain_step(model, opt)))

    torch.manual_seed(0)
    model = build_model(args.width, args.layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    modes.append(Mode("horo", model, plain_step(model, opt)))

    if args.peer == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, root_rank=0, name="ddp.port")
        own_gpu = device.type == "cuda" and hvd.local_size() <= torch.cuda.device_count()
        backend = "nccl" if own_gpu else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(),
                                world_size=hvd.size())
        torch.manual_seed(0)
        model = DDP(build_model(args.width, args.layers).to(device))
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        modes.append(Mode(f"ddp ({backend})", model, plain_step(model, opt)))
    return modes


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(mode, args, device):
    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.num_warmup):
        mode.step()
    synchronize()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(args.num_iters):
        mode.step()
    synchronize()
    elapsed = time.perf_counter() - start
    # The job's throughput is set by its slowest rank.
    slowest = hvd.allreduce(torch.tensor([elapsed]), op=hvd.Max, name=f"elapsed.{mode.name}").item()
    return args.batch_size * hvd.size() * args.num_iters / slowest


def main():
    args = parse_args()
    hvd.init()
    threads = args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    if not args.no_cuda and torch.cuda.is_available():
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(1234 + hvd.rank())
    data = torch.randn(args.batch_size, args.width).to(device)
    target = torch.randint(0, 10, (args.batch_size,)).to(device)
    modes = make_modes(args, data, target, device)
    params = sum(p.numel() for p in modes[0].model.parameters())
    tensors = len(list(modes[0].model.parameters()))
    if hvd.rank() == 0:
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{threads} torch thread(s) per rank"
        print(f"model: {params / 1e6:.1f}M parameters in {tensors} tensors; batch {args.batch_size} per rank; "
              f"{hvd.size()} ranks; {device.type}: {where}", flush=True)
    # A round of every mode before the timed ones: the first second or so of a job runs slower
    # whatever runs in it (about 0.7x; docs/benchmarks.md, stop 57), which made the first repeat's
    # ratio of the first mode to the second meaningless.
    for mode in modes:
        measure(mode, args, device)
    results = {m.name: [] for m in modes}
    for r in range(args.repeats):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            results[mode.name].append(measure(mode, args, device))
    if hvd.rank() == 0:
        median = {name: statistics.median(v) for name, v in results.items()}
        print(f"{'mode':<14} {'samples/s (median)':>19}   runs")
        for name, v in results.items():
            print(f"{name:<14} {median[name]:>19.1f}   " + " ".join(f"{x:.1f}" for x in v))
        horo = median["horo"]
        print(f"horo / compute-only ceiling: {horo / median['compute only']:.2f}")
        paired = [h / c for h, c in zip(results["horo"], results["compute only"])]
        print(f"horo / ceiling per repeat: {' '.join(f'{x:.2f}' for x in paired)} "
              f"(median {statistics.median(paired):.2f})")
        for name in median:
            if name.startswith("ddp"):
                print(f"horo / {name}: {horo / median[name]:.2f}")
    for mode in modes[1:]:
        check_replicas_agree(mode)
    if hvd.rank() == 0:
        print("parameters agree across ranks: " + ", ".join(m.name for m in modes[1:]))
    hvd.shutdown()


def check_replicas_agree(mode):
    """Synchronous data parallelism keeps one model: every rank's parameters must be bitwise those
    of rank 0 after training (the compute-only ceiling trains each rank on its own)."""
    mine = torch.cat([p.detach().reshape(-1) for p in mode.model.parameters()])
    root = hvd.broadcast(mine, root_rank=0, name=f"check.{mode.name}")
    differ = hvd.allgather(torch.tensor([int((mine != root).sum())]), name=f"check.{mode.name}.differ").tolist()
    if any(differ):
        ranks = ", ".join(f"rank {r}: {n}" for r, n in enumerate(differ) if n)
        raise SystemExit(f"{mode.name}: parameters differ from rank 0's ({ranks} of {mine.numel()})")


if __name__ == "__main__":
    main()
