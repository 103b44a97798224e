"""Correctness of horo_torch on CUDA tensors, for a machine with a GPU (CI has none: this script is
not collected by pytest; run it by hand where a GPU is lent, see docs/benchmarks.md).

    CUDA_VISIBLE_DEVICES=0 python examples/benchmarks/cuda_check.py --np 2   # two ranks share GPU 0: the core stages
    python examples/benchmarks/cuda_check.py --np 2    # with two GPUs or more: one each, NCCL
    python examples/benchmarks/cuda_check.py --np 1    # one rank: NCCL with one member

Every rank uses GPU ``local_rank % device_count``, so ``--np 2`` shares a GPU only where one is
visible. Every check has an exact expected value derived
from the ranks; the script prints each failure and exits non-zero if any check failed.
"""
import argparse
import sys
import traceback

import torch


def contribution(op, rank, count, dtype):
    i = torch.arange(count, dtype=torch.float64)
    if dtype == torch.bool:
        return ((rank + i) % 3 != 0).to(torch.float64)
    if op == "Product":
        return 1.0 + (rank + i) % 2
    return (rank + 1.0) * (1 + i % 3)


def expected(op, dtype, n, count):
    stack = torch.stack([contribution(op, r, count, dtype) for r in range(n)])
    if dtype == torch.bool:
        bits = stack != 0
        return (bits.all(0) if op in ("Min", "Product") else bits.any(0)).to(dtype)
    if op in ("Sum", "Average"):
        total = stack.sum(0)
        if op == "Average":
            total = torch.trunc(total / n) if not dtype.is_floating_point else total / n
        return total.to(dtype)
    return {"Min": stack.min(0).values, "Max": stack.max(0).values, "Product": stack.prod(0)}[op].to(dtype)


class Checks:
    def __init__(self, rank):
        self.rank, self.count, self.failures = rank, 0, []

    def equal(self, what, got, want):
        self.count += 1
        if not isinstance(got, torch.Tensor):
            self.failures.append(f"{what}: got {type(got).__name__}")
            return
        if got.device != want.device and want.device.type == "cuda":
            self.failures.append(f"{what}: result on {got.device}, want {want.device}")
            return
        g, w = got.detach().cpu(), want.detach().cpu()
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            self.failures.append(f"{what}: got {g.dtype}{list(g.shape)} {g.flatten()[:6].tolist()}, "
                                 f"want {w.dtype}{list(w.shape)} {w.flatten()[:6].tolist()}")

    def run(self, what, fn):
        try:
            fn()
        except Exception:
            self.count += 1
            self.failures.append(f"{what}: raised\n{traceback.format_exc()}")


def rank_main():
    import horo_torch as hvd
    from horo_torch import device as hdevice
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    c = Checks(rank)
    dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.bool]
    ops = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}

    def allreduce_matrix():
        for dtype in dtypes:
            for op_name, op in ops.items():
                if dtype == torch.bool and op_name == "Average":
                    continue
                for count in (0, 1, 7, 65537):
                    x = contribution(op_name, rank, count, dtype).to(dtype).to(dev)
                    want = expected(op_name, dtype, n, count).to(dev)
                    tag = f"{dtype}/{op_name}/{count}"
                    c.equal(f"allreduce {tag}", hvd.allreduce(x, op=op), want)
                    y = x.clone()
                    hvd.allreduce_(y, op=op, name=f"inplace.{tag}")
                    c.equal(f"allreduce_ {tag}", y, want)
    c.run("allreduce matrix", allreduce_matrix)

    def grouped_and_scaled():
        xs = [torch.full((5 + i,), float(rank + 1), device=dev) for i in range(4)]
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
        for i, o in enumerate(outs):
            c.equal(f"grouped_allreduce[{i}]", o, torch.full((5 + i,), n * (n + 1) / 2, device=dev))
        ys = [x.clone() for x in xs]
        hvd.grouped_allreduce_(ys, op=hvd.Average)
        c.equal("grouped_allreduce_ average", ys[0], torch.full((5,), (n + 1) / 2, device=dev))
        x = torch.full((9,), float(rank + 1), device=dev)
        c.equal("prescale/postscale", hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
                torch.full((9,), n * (n + 1) / 4, device=dev))
        xi = torch.full((3,), 10 * (rank + 1), dtype=torch.int32, device=dev)
        c.equal("int average with scale", hvd.allreduce(xi, op=hvd.Average, prescale_factor=0.5),
                torch.full((3,), (5 * n * (n + 1) // 2) // n, dtype=torch.int32, device=dev))
        nc = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4)[:, ::2] * (rank + 1)
        c.equal("non-contiguous", hvd.allreduce(nc, op=hvd.Sum),
                torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4)[:, ::2] * n * (n + 1) / 2)
        hvd.allreduce_(nc, op=hvd.Sum)
        c.equal("non-contiguous in place", nc,
                torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4)[:, ::2] * n * (n + 1) / 2)
    c.run("grouped and scaled", grouped_and_scaled)

    def large():
        # Tens of MB, alone and fused, of odd lengths: through NCCL or staged in one pinned buffer.
        sizes = (3_000_001, 1_500_000, 2_500_003)
        base = [torch.arange(k, dtype=torch.float32, device=dev) % 1000 for k in sizes]
        want = [b * n + n * (n - 1) / 2 for b in base]
        c.equal("allreduce 12 MB", hvd.allreduce(base[0] + rank, op=hvd.Sum, name="big.alone"), want[0])
        outs = hvd.grouped_allreduce([b + rank for b in base[1:]], op=hvd.Sum, name="big.fused")
        for i, o in enumerate(outs):
            c.equal(f"grouped allreduce of 16 MB [{i}]", o, want[i + 1])
        sevens = (torch.arange(5_000_000, device=dev) % 7).to(torch.float16)
        c.equal("allreduce float16 10 MB", hvd.allreduce(sevens + rank, op=hvd.Max, name="big.half"), sevens + n - 1)
        b = torch.arange(3_000_000, dtype=torch.int64, device=dev) * (rank + 1)
        c.equal("broadcast 24 MB", hvd.broadcast(b, n - 1, name="big.bcast"),
                torch.arange(3_000_000, dtype=torch.int64, device=dev) * n)
    c.run("large tensors", large)

    def stream_ordering():
        # The input is written on a side stream after a long sleep kernel; the collective must see
        # the final value, and its result must be what later work on that stream reads.
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            x = torch.zeros(1 << 20, device=dev)
            torch.cuda._sleep(200_000_000)
            x.fill_(rank + 1)
            hvd.allreduce_(x, op=hvd.Sum, name="stream.inplace")
            y = x * 2
            b = torch.zeros(1 << 16, device=dev)
            torch.cuda._sleep(100_000_000)
            b.fill_(rank + 7)
            z = hvd.broadcast(b, root_rank=n - 1, name="stream.bcast")
            g = torch.zeros(4, 3, device=dev)
            torch.cuda._sleep(100_000_000)
            g.fill_(rank)
            gathered = hvd.allgather(g, name="stream.gather")
        side.synchronize()
        c.equal("side stream allreduce", y, torch.full((1 << 20,), float(n * (n + 1)), device=dev))
        c.equal("side stream broadcast", z, torch.full((1 << 16,), float(n - 1 + 7), device=dev))
        c.equal("side stream allgather", gathered,
                torch.arange(n, dtype=torch.float32, device=dev).repeat_interleave(4)[:, None].expand(4 * n, 3))
    c.run("stream ordering", stream_ordering)

    def other_collectives():
        for root in sorted({0, n - 1}):
            x = torch.full((17,), float(rank), device=dev)
            c.equal(f"broadcast root {root}", hvd.broadcast(x, root), torch.full((17,), float(root), device=dev))
            hvd.broadcast_(x, root, name=f"bcast_.{root}")
            c.equal(f"broadcast_ root {root}", x, torch.full((17,), float(root), device=dev))
            xb = torch.tensor([rank % 2 == 0, True], device=dev)
            c.equal(f"broadcast bool root {root}", hvd.broadcast(xb, root),
                    torch.tensor([root % 2 == 0, True], device=dev))
        rows = rank + 1
        g = torch.full((rows, 2), float(rank), device=dev)
        want = torch.cat([torch.full((r + 1, 2), float(r), device=dev) for r in range(n)])
        c.equal("allgather uneven", hvd.allgather(g), want)
        outs = hvd.grouped_allgather([g, g.to(torch.int64)])
        c.equal("grouped_allgather", outs[1], want.to(torch.int64))
        splits = torch.tensor([(rank + j) % 2 + 1 for j in range(n)], dtype=torch.int32)
        src = torch.arange(int(splits.sum()), dtype=torch.float32, device=dev) + 100 * rank
        out, received = hvd.alltoall(src, splits=splits)
        parts = []
        for j in range(n):
            their = [(j + k) % 2 + 1 for k in range(n)]
            start = sum(their[:rank])
            parts.append(torch.arange(start, start + their[rank], dtype=torch.float32, device=dev) + 100 * j)
        c.equal("alltoall splits", out, torch.cat(parts))
        c.equal("alltoall received splits", received,
                torch.tensor([(j + rank) % 2 + 1 for j in range(n)], dtype=torch.int32))
        rs = torch.arange(2 * n * 3, dtype=torch.float32, device=dev).reshape(2 * n, 3) * (rank + 1)
        full = torch.arange(2 * n * 3, dtype=torch.float32, device=dev).reshape(2 * n, 3) * n * (n + 1) / 2
        c.equal("reducescatter", hvd.reducescatter(rs, op=hvd.Sum), full[2 * rank:2 * rank + 2])
        idx = torch.tensor([[rank, (rank + 1) % 4]], device=dev)
        sp = torch.sparse_coo_tensor(idx, torch.ones(2, device=dev), (4,))
        handle = hvd.sparse_allreduce_async(sp, "sparse.check", hvd.Sum)
        dense_want = torch.zeros(4, device=dev)
        for r in range(n):
            dense_want[r % 4] += 1
            dense_want[(r + 1) % 4] += 1
        c.equal("sparse allreduce", handle().to_dense(), dense_want)
    c.run("other collectives", other_collectives)

    def training():
        torch.manual_seed(rank)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        torch.manual_seed(0)
        root_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(dev)
        for (k, v), rv in zip(model.state_dict().items(), root_model.state_dict().values()):
            c.equal(f"broadcast_parameters {k}", v, rv)
        dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        data = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)).to(dev)
        target = data.sum(1, keepdim=True)
        shard = slice(rank * 32 // n, (rank + 1) * 32 // n)
        # Reference: the same model trained on the whole batch in one process (mean loss over
        # equal shards equals the mean of the shard means).
        ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(dev)
        ref.load_state_dict(model.state_dict())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            dopt.zero_grad()
            torch.nn.functional.mse_loss(model(data[shard]), target[shard]).backward()
            dopt.step()
            ref_opt.zero_grad()
            sum(torch.nn.functional.mse_loss(ref(data[r * 32 // n:(r + 1) * 32 // n]),
                                             target[r * 32 // n:(r + 1) * 32 // n]) for r in range(n)).div(n).backward()
            ref_opt.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            c.count += 1
            if not torch.allclose(p, q, rtol=1e-4, atol=1e-5):
                c.failures.append(f"DistributedOptimizer {name}: max diff {(p - q).abs().max().item()}")
            same = hvd.allgather(p.detach()[None])
            c.equal(f"DistributedOptimizer {name} identical on every rank", same, p.detach()[None].expand_as(same))
        ddp_model = torch.nn.Linear(8, 1).to(dev)
        ddp = hvd.DistributedDataParallel(ddp_model)
        ddp(data[shard]).sum().backward()
        want = data.sum(0) / n  # mean over ranks of each shard's sum of inputs
        c.count += 1
        if not torch.allclose(ddp_model.weight.grad[0], want, rtol=1e-5, atol=1e-5):
            c.failures.append(f"DDP gradient: got {ddp_model.weight.grad[0].tolist()}, want {want.tolist()}")
    c.run("training", training)

    def errors():
        from horo_core import basics
        from horo_core.errors import HoroMismatchError
        if n > 1 and hdevice.core_takes(basics.runtime(), [torch.zeros(1, device=dev)]):
            x = torch.ones(3) if rank == 0 else torch.ones(3, device=dev)
            try:
                hvd.allreduce(x, name="device.mismatch")
                c.failures.append("CPU/GPU mismatch: no error")
            except HoroMismatchError as exc:
                c.count += 1
                if "CPU/GPU device selection" not in str(exc):
                    c.failures.append(f"CPU/GPU mismatch: unexpected message {exc}")
    c.run("errors", errors)

    info = {"rank": rank, "device": str(dev), "nccl_built": hvd.nccl_built(), "cuda_built": hvd.cuda_built(),
            "checks": c.count, "failures": c.failures}
    hvd.shutdown()
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_check: no CUDA GPU is visible (torch.cuda.is_available() is False)")
    import horo_runner
    results = horo_runner.run(rank_main, num_proc=args.np, env={"HORO_LOG_LEVEL": "INFO"})
    failed = False
    for r in results:
        print(f"rank {r['rank']} on {r['device']}: nccl_built={r['nccl_built']} cuda_built={r['cuda_built']} "
              f"checks={r['checks']} failures={len(r['failures'])}")
        for f in r["failures"]:
            print("  FAIL", f)
            failed = True
    print("CUDA CHECK", "FAILED" if failed else "PASSED", f"(np={args.np})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
