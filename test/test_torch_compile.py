"""horo_torch under torch.compile: a collective that compiled code calls runs eagerly (a graph break,
as Horovod's C-extension ops), and so do the hooks of a backward that compiled code starts; training
compiled whole (forward, backward and the optimizer's step in one compiled function) matches one
process on the global batch. The same wrapper puts each public collective in a range of the torch
profiler.

The compiled functions use the "eager" backend: what is checked is Dynamo's tracing, and the
inductor's code generation would only add minutes.
"""
import copy

import torch

import horo_runner
from test_torch_ddp import problems_in, run_groups

ROWS = 4  # per rank


def compiled(fn):
    return torch.compile(fn, backend="eager")


def check_collectives(c, hvd):
    """Each collective called from a compiled function gives what it gives eagerly."""
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(6.0) + r
    calls = {
        "allreduce": lambda t: hvd.allreduce(t * 2, name="c.allreduce") + 1,
        "allreduce_": lambda t: hvd.allreduce_(t.clone(), op=hvd.Sum, name="c.allreduce_") - 1,
        "grouped_allreduce": lambda t: torch.cat(hvd.grouped_allreduce([t, t * 3], name="c.grouped")),
        "allreduce_async": lambda t: hvd.synchronize(hvd.allreduce_async(t, op=hvd.Max, name="c.async")),
        "allgather": lambda t: hvd.allgather(t.view(2, 3), name="c.allgather").sum(0),
        "broadcast": lambda t: hvd.broadcast(t, root_rank=n - 1, name="c.broadcast") * 2,
        "broadcast_": lambda t: hvd.broadcast_(t.clone(), root_rank=0, name="c.broadcast_"),
        "alltoall": lambda t: hvd.alltoall(t.repeat(n), name="c.alltoall"),
        "reducescatter": lambda t: hvd.reducescatter(t.repeat(n), op=hvd.Sum, name="c.reducescatter"),
    }
    for what, call in calls.items():
        c.close(f"{what} in a compiled function", compiled(call)(x), call(x))
    got = compiled(lambda t: t + hvd.broadcast_object({"rank": r}, root_rank=1)["rank"])(x)
    c.close("broadcast_object in a compiled function", got, x + 1)


def batches(step):
    """Every rank's rows of a step, the global batch (all ranks draw the same from the seed)."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(ROWS * 8, 4, generator=g), torch.randn(ROWS * 8, 1, generator=g)


def check_training_compiled_whole(c, hvd):
    """zero_grad, forward, backward and step in one compiled function, 3 steps: with
    DistributedOptimizer (and a BatchNorm of each rank's rows) the parameters match one process
    averaging the ranks' losses; with the DistributedDataParallel wrapper (and SyncBatchNorm) one
    process training on the global batch."""
    r, n = hvd.rank(), hvd.size()
    mine = slice(r * ROWS, (r + 1) * ROWS)
    for kind in ("DistributedOptimizer", "DistributedDataParallel"):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
        reference = copy.deepcopy(model)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        if kind == "DistributedOptimizer":
            trained = model
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                           named_parameters=model.named_parameters())
        else:
            trained = hvd.DistributedDataParallel(hvd.SyncBatchNorm.convert_sync_batchnorm(model))
            opt = torch.optim.SGD(trained.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(trained(x), y)
            loss.backward()
            opt.step()
            return loss

        step = compiled(step)
        for k in range(3):
            x, y = batches(k)
            step(x[:n * ROWS][mine], y[:n * ROWS][mine])
            ref_opt.zero_grad()
            if kind == "DistributedOptimizer":
                rows = [slice(i * ROWS, (i + 1) * ROWS) for i in range(n)]
                (sum(torch.nn.functional.mse_loss(reference(x[s]), y[s]) for s in rows) / n).backward()
            else:
                torch.nn.functional.mse_loss(reference(x[:n * ROWS]), y[:n * ROWS]).backward()
            ref_opt.step()
        for i, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
            c.close(f"{kind} compiled whole: parameter {i} after 3 steps", p.detach(), q.detach(), 1e-5)


def check_profiler_ranges(c, hvd):
    """Under the torch profiler, each public collective called runs in a horo::<name> range, and the
    DDP wrapper's forward in torch DDP's DistributedDataParallel.forward."""
    from torch.profiler import ProfilerActivity, profile
    model = torch.nn.Linear(4, 2)
    ddp = hvd.DistributedDataParallel(copy.deepcopy(model))
    t = torch.ones(4)
    hvd.allgather(t, name="p.before")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        hvd.allreduce(t, name="p.allreduce")
        hvd.synchronize(hvd.allreduce_async_(t, name="p.async"))
        ddp(torch.ones(2, 4)).sum().backward()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.allgather(t, name="p.after")
    counts = {}
    for event in prof.events():
        counts[event.name] = counts.get(event.name, 0) + 1
    c.same("the ranges of the profiled calls", {k: v for k, v in counts.items() if k.startswith("horo::")},
           {"horo::allreduce": 1,
            # the call's own, and the DDP bucket's from the default comm hook
            "horo::allreduce_async_": 2,
            # the call's, DDP's wait at the end of backward, broadcast_parameters' for its digest and tensors
            "horo::synchronize": 5,
            "horo::broadcast_parameters": 1, "horo::allgather_async": 1, "horo::broadcast_async_": 2,
            "horo::broadcast_": 1})
    c.same("DDP's forward range", counts.get("DistributedDataParallel.forward"), 1)


def run_checks():
    import horo_torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    groups = (check_collectives, check_training_compiled_whole, check_profiler_ranges)
    report = run_groups({group.__name__: lambda c, group=group: group(c, hvd) for group in groups})
    hvd.shutdown()
    return report


def test_collectives_and_training_under_torch_compile():
    reports = horo_runner.run(run_checks, num_proc=2, env={"HORO_PEER_TIMEOUT_SECONDS": "120"})
    problems = problems_in(reports)
    assert len(reports) == 2 and not problems, "\n".join(problems[:40])
