"""horo_torch.sync_batch_norm.SyncBatchNorm: N ranks, each with its rows of a batch, compute exactly
what torch's BatchNorm computes in one process on the whole batch.

One ``horo_runner.run`` per world size runs every check on every rank. Every rank draws the same full
batch from the same seed and also runs the single-process reference, so each rank compares outputs,
input gradients, weight and bias gradients (summed over ranks) and running statistics.
"""
import pytest
import torch

import horo_runner
from test_torch_ddp import RUN_ENV, init_with_pair, problems_in, run_groups

SIZES = [2, 3]


def row_counts(size, uneven):
    """Rows per rank: 4 each, or 2 + 2 * rank (different on every rank)."""
    return [2 + 2 * r if uneven else 4 for r in range(size)]


def my_rows(t, counts, rank):
    start = sum(counts[:rank])
    return t[start:start + counts[rank]]


def make_pair(bn_cls, channels, process_set, **kwargs):
    """A torch BatchNorm and a SyncBatchNorm with the same (non-trivial) weight and bias."""
    from horo_torch.sync_batch_norm import SyncBatchNorm
    ref = bn_cls(channels, **kwargs).double()
    sync = SyncBatchNorm(channels, process_set=process_set, **kwargs).double()
    if ref.affine:
        with torch.no_grad():
            for m in (ref, sync):
                m.weight.copy_(torch.linspace(0.5, 1.5, channels))
                m.bias.copy_(torch.linspace(-0.2, 0.3, channels))
    return ref, sync


def compare_steps(hvd, c, what, bn_cls, shape_tail, uneven=False, steps=3, process_set=None, **kwargs):
    """Several training steps, then eval: outputs, input, weight and bias gradients, running stats."""
    process_set = process_set or hvd.global_process_set
    size, rank = process_set.size(), process_set.rank()
    channels = shape_tail[0]
    ref, sync = make_pair(bn_cls, channels, process_set, **kwargs)
    counts = row_counts(size, uneven)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x_full = (torch.randn(sum(counts), *shape_tail, generator=g, dtype=torch.float64) * (step + 1) + step)
        weights = torch.randn(x_full.shape, generator=g, dtype=torch.float64)
        x_ref = x_full.clone().requires_grad_()
        out_ref = ref(x_ref)
        (out_ref * weights).sum().backward()
        x = my_rows(x_full, counts, rank).clone().requires_grad_()
        out = sync(x)
        (out * my_rows(weights, counts, rank)).sum().backward()
        c.close(f"{what} step {step} output", out.detach(), my_rows(out_ref.detach(), counts, rank))
        c.close(f"{what} step {step} input grad", x.grad, my_rows(x_ref.grad, counts, rank))
        if ref.affine:
            for name in ("weight", "bias"):
                total = hvd.allreduce(getattr(sync, name).grad, op=hvd.Sum, process_set=process_set)
                c.close(f"{what} step {step} {name} grad summed over ranks", total, getattr(ref, name).grad)
                getattr(sync, name).grad = None
                getattr(ref, name).grad = None
        if ref.track_running_stats:
            c.close(f"{what} step {step} running_mean", sync.running_mean, ref.running_mean)
            c.close(f"{what} step {step} running_var", sync.running_var, ref.running_var)
            c.same(f"{what} step {step} num_batches_tracked", int(sync.num_batches_tracked),
                   int(ref.num_batches_tracked))
    ref.eval()
    sync.eval()
    x_full = torch.randn(sum(counts), *shape_tail, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    with torch.no_grad():
        c.close(f"{what} eval output", sync(my_rows(x_full, counts, rank)), my_rows(ref(x_full), counts, rank))


def check_shapes(hvd, c):
    nn = torch.nn
    compare_steps(hvd, c, "1d (N,C)", nn.BatchNorm1d, (5,))
    compare_steps(hvd, c, "1d (N,C,L) uneven", nn.BatchNorm1d, (3, 7), uneven=True)
    compare_steps(hvd, c, "2d", nn.BatchNorm2d, (4, 3, 5))
    compare_steps(hvd, c, "3d", nn.BatchNorm3d, (2, 2, 3, 2), steps=2)


def check_options(hvd, c):
    nn = torch.nn
    compare_steps(hvd, c, "momentum None", nn.BatchNorm1d, (3, 4), momentum=None)
    compare_steps(hvd, c, "no affine", nn.BatchNorm1d, (3, 4), affine=False, eps=1e-3)
    compare_steps(hvd, c, "no running stats", nn.BatchNorm2d, (3, 2, 2), track_running_stats=False, steps=2)


def check_low_precision(hvd, c):
    """float32 and bfloat16 inputs keep their dtype; statistics are still computed across ranks."""
    from horo_torch.sync_batch_norm import SyncBatchNorm
    size, rank = hvd.size(), hvd.rank()
    x_full = torch.randn(4 * size, 3, 5, generator=torch.Generator().manual_seed(5))
    want = torch.nn.functional.batch_norm(x_full, None, None, training=True)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        bn = SyncBatchNorm(3)
        out = bn(x_full[4 * rank:4 * rank + 4].to(dtype))
        c.same(f"{dtype} output dtype", out.dtype, dtype)
        c.close(f"{dtype} output", out.float(), want[4 * rank:4 * rank + 4], tol)


def check_errors(hvd, c):
    from horo_torch.sync_batch_norm import SyncBatchNorm
    rank = hvd.rank()
    bn = SyncBatchNorm(3)
    c.raises("1-D input", ValueError, "at least 2D", lambda: bn(torch.zeros(3)))
    c.raises("wrong channels", ValueError, "expected 3 channels", lambda: bn(torch.zeros(2, 4)))
    # One row in total over all ranks (the others contribute none): every rank raises, as torch does.
    rows = 1 if rank == 0 else 0
    c.raises("one value per channel in total", ValueError, "more than 1 value per channel",
             lambda: bn(torch.ones(rows, 3)))
    # A rank with no rows takes part in the statistics and in backward.
    ref = torch.nn.BatchNorm1d(3).double()
    sync = SyncBatchNorm(3).double()
    x_full = torch.randn(5, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    counts = [5 if r == 0 else 0 for r in range(hvd.size())]
    x = my_rows(x_full, counts, rank).clone().requires_grad_()
    x_ref = x_full.clone().requires_grad_()
    ref(x_ref).pow(2).sum().backward()
    sync(x).pow(2).sum().backward()
    c.close("ranks without rows: input grad", x.grad, my_rows(x_ref.grad, counts, rank))
    c.close("ranks without rows: running_var", sync.running_var, ref.running_var)


def check_convert(hvd, c):
    from horo_torch.sync_batch_norm import SyncBatchNorm
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Sequential(torch.nn.ReLU(), torch.nn.BatchNorm2d(4, momentum=0.3)))
    model[1].weight.data.uniform_()
    model[2][1].eval()
    weight = model[1].weight
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    c.same("same module returned", converted is model, True)
    c.same("types", [type(m).__name__ for m in (model[1], model[2][1])], ["SyncBatchNorm", "SyncBatchNorm"])
    c.same("weight carried over", model[1].weight is weight, True)
    c.same("momentum and training carried over", (model[2][1].momentum, model[2][1].training), (0.3, False))
    single = SyncBatchNorm.convert_sync_batchnorm(torch.nn.BatchNorm1d(7))
    c.same("a BatchNorm itself", (type(single).__name__, single.num_features), ("SyncBatchNorm", 7))


def check_with_ddp(hvd, c):
    """DDP over a converted model: parameters and running stats match one process on the N*b batch."""
    from horo_torch.ddp import DistributedDataParallel
    from horo_torch.sync_batch_norm import SyncBatchNorm
    size, rank = hvd.size(), hvd.rank()

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(),
                                   torch.nn.Linear(6, 2)).double()

    ref = make()
    ddp = DistributedDataParallel(SyncBatchNorm.convert_sync_batchnorm(make()))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(3 * size, 4, generator=g, dtype=torch.float64), torch.randn(3 * size, 2, generator=g,
                                                                                     dtype=torch.float64)
        for model, optimizer, xs, ys in ((ref, ref_opt, x, y), (ddp, opt, x[3 * rank:3 * rank + 3],
                                                                 y[3 * rank:3 * rank + 3])):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xs), ys).backward()
            optimizer.step()
    for (name, p), q in zip(ddp.module.state_dict().items(), ref.state_dict().values()):
        c.close(f"ddp + SyncBatchNorm {name}", p.double(), q.double())


def check_process_set(hvd, c, pair):
    if pair.included():
        compare_steps(hvd, c, "process set", torch.nn.BatchNorm1d, (3, 2), uneven=True, process_set=pair)
    else:
        c.raises("the rank of a non-member", ValueError, "is not part of process set", pair.rank)


def check_after_unnamed_calls_that_differ(hvd, c):
    """The layer's collectives are named, so the user's unnamed ones, whose count may differ from rank
    to rank (here rank 0 reduces once more while the others have joined), do not shift them. Run
    last: the ranks' unnamed allreduces stay out of step after it."""
    if hvd.rank() == 0:
        hvd.allreduce(torch.ones(1))
    hvd.join()
    compare_steps(hvd, c, "after unnamed calls that differ", torch.nn.BatchNorm1d, (3,), affine=False, steps=2)


def run_checks(size):
    import horo_torch as hvd

    pair = init_with_pair(hvd, size)
    report = run_groups({
        "shapes": lambda c: check_shapes(hvd, c),
        "options": lambda c: check_options(hvd, c),
        "low_precision": lambda c: check_low_precision(hvd, c),
        "errors": lambda c: check_errors(hvd, c),
        "convert": lambda c: check_convert(hvd, c),
        "with_ddp": lambda c: check_with_ddp(hvd, c),
        "process_set": lambda c: check_process_set(hvd, c, pair),
        "after_unnamed_calls_that_differ": lambda c: check_after_unnamed_calls_that_differ(hvd, c),
    })
    hvd.barrier()
    hvd.shutdown()
    return report


@pytest.mark.parametrize("size", SIZES, ids=[f"np{n}" for n in SIZES])
def test_sync_batch_norm_matches_single_process(size):
    problems = problems_in(horo_runner.run(run_checks, args=(size,), num_proc=size, env=RUN_ENV))
    assert not problems, "\n".join(problems[:40])
