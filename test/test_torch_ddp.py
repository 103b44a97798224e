"""horo_torch.ddp.DistributedDataParallel: N ranks with batch b each train exactly like one process on
the concatenated N*b batch.

One ``horo_runner.run`` per world size runs every check on every rank. Every rank also trains the
single-process reference itself (all ranks draw the same full batches from the same seeds and take
their own rows), so each rank compares its parameters with the reference after every run.
"""
import traceback

import pytest
import torch

import horo_runner
from ddp_models import (BATCH, TINY_BUCKETS_MB, Branchy, Mlp, Normed, Reordered, Rotary, RunTwiceCheckpointed,
                        TwoHeads, adam, batch, local_loss, reference_step, rows, sgd, train_and_compare)

SIZES = [2, 3]


class Checks:
    """Collects the outcome of every check of one group on one rank."""

    def __init__(self):
        self.count = 0
        self.failures = []

    def same(self, what, got, want):
        self.count += 1
        if got != want:
            self.failures.append(f"{what}: got {got!r}, want {want!r}")

    def close(self, what, got, want, tol=1e-10):
        """Tensors got and want must agree within tol (absolute plus relative)."""
        self.count += 1
        if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
            diff = (got - want).abs().max().item() if got.shape == want.shape else "shape"
            self.failures.append(f"{what}: max difference {diff} > {tol}")

    def raises(self, what, exc_type, text, fn):
        self.count += 1
        try:
            fn()
        except exc_type as exc:
            if text not in str(exc):
                self.failures.append(f"{what}: message {str(exc)!r} lacks {text!r}")
            return
        except Exception as exc:  # noqa: BLE001 - the type is what is checked
            self.failures.append(f"{what}: raised {type(exc).__name__}: {exc}")
            return
        self.failures.append(f"{what}: did not raise {exc_type.__name__}")


# Checks ------------------------------------------------------------------------------------------

def check_equivalence(hvd, c):
    train_and_compare(hvd, c, "sgd", Mlp, sgd)
    train_and_compare(hvd, c, "adam", Mlp, adam)


def check_bucket_rebuild(hvd, c, layouts):
    """Reverse registration order differs from the backward order: the rebuild must fix it."""
    from horo_torch import comm_hooks
    launches = []

    def recording_hook(state, bucket):
        # Parameters whose gradient is still missing when the bucket is launched: > 0 means overlap.
        missing = sum(p.grad is None for p in ddp_params)
        launches.append((bucket.index(), missing))
        return comm_hooks.allreduce_hook(state, bucket)

    before = []

    def on_step(step, ddp):
        if step == 0:
            layouts["rebuilt"] = ddp.buckets

    torch.manual_seed(0)
    probe = Reordered()
    from horo_torch.ddp import DistributedDataParallel
    initial = DistributedDataParallel(probe.double(), bucket_cap_mb=TINY_BUCKETS_MB).buckets
    before.extend(initial)
    ddp_params = []

    def opt_fn(params):
        ddp_params[:] = list(params)  # the last call is the wrapper's optimizer
        return sgd(ddp_params)

    ddp = train_and_compare(hvd, c, "rebuild sgd", Reordered, opt_fn, steps=3, hook=recording_hook,
                            on_step=on_step)
    names = [n for b in before for n in b]
    c.same("initial buckets follow reverse registration order", names,
           ["body.bias", "body.weight", "head.bias", "head.weight"])
    c.same("one parameter per bucket", [len(b) for b in before], [1, 1, 1, 1])
    rebuilt = [n for b in layouts["rebuilt"] for n in b]
    c.same("rebuilt: head before body", sorted(rebuilt[:2]) + sorted(rebuilt[2:]),
           ["head.bias", "head.weight", "body.bias", "body.weight"])
    c.same("rebuilt flag", ddp.buckets_rebuilt, True)
    c.same("buckets unchanged after the rebuild", ddp.buckets, layouts["rebuilt"])
    later = [missing for index, missing in launches[4:] if index == 0]
    c.same("bucket 0 launched while body gradients were pending", all(m >= 2 for m in later) and len(later) == 2,
           True)
    layouts["initial"] = tuple(before)


def check_no_sync(hvd, c):
    from horo_torch.ddp import DistributedDataParallel
    train_and_compare(hvd, c, "no_sync sgd", Mlp, sgd, steps=2, micro=3)
    # Inside no_sync gradients stay local: they equal a lone process's gradients on this rank's rows.
    rank = hvd.rank()
    torch.manual_seed(0)
    solo = Mlp().double()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Mlp().double())
    x, y = batch(7, hvd.size() * BATCH, torch.float64)
    with ddp.no_sync():
        local_loss(ddp, rows(x, rank), rows(y, rank), rank).backward()
    local_loss(solo, rows(x, rank), rows(y, rank), rank).backward()
    for p, q in zip(ddp.module.parameters(), solo.parameters()):
        c.close("no_sync keeps local gradients", p.grad, q.grad, 1e-12)


def check_wrapped_again(hvd, c):
    """A dropped wrapper takes its gradient hooks with it: the same module wrapped again reduces
    each gradient once, to the mean over the ranks."""
    import gc
    import weakref

    from horo_torch.ddp import DistributedDataParallel
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    module = Mlp().double()
    torch.manual_seed(0)
    ref = Mlp().double()
    x, y = batch(9, size * BATCH, torch.float64)
    first = DistributedDataParallel(module)
    local_loss(first, rows(x, rank), rows(y, rank), rank).backward()
    dropped = weakref.ref(first)
    hooks = [len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in module.parameters()]
    del first
    gc.collect()
    c.same("a dropped wrapper is freed (its hooks do not hold it)", dropped() is None, True)
    c.same("its hooks are removed", (hooks, [len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
                                             for p in module.parameters()]), ([1] * len(hooks), [0] * len(hooks)))
    module.zero_grad()
    second = DistributedDataParallel(module)
    local_loss(second, rows(x, rank), rows(y, rank), rank).backward()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    for p, q in zip(module.parameters(), ref.parameters()):
        c.close("wrapped again: the mean gradient over the ranks", p.grad, q.grad, 1e-12)


def check_compression_hooks(hvd, c):
    from horo_torch import comm_hooks
    train_and_compare(hvd, c, "fp16 adam", Mlp, adam, hook=comm_hooks.fp16_compress_hook, tol=2e-3,
                      dtype=torch.float32)
    train_and_compare(hvd, c, "bf16 sgd", Mlp, sgd, hook=comm_hooks.bf16_compress_hook, tol=2e-2,
                      dtype=torch.float32)
    train_and_compare(hvd, c, "allreduce hook sgd", Mlp, sgd, hook=comm_hooks.allreduce_hook)
    # torch DDP's private _register_builtin_comm_hook, which some scripts call.
    import torch.distributed as dist
    train_and_compare(hvd, c, "builtin FP16_COMPRESS", Mlp, adam, hook=dist.BuiltinCommHookType.FP16_COMPRESS,
                      tol=2e-3, dtype=torch.float32)
    train_and_compare(hvd, c, "builtin ALLREDUCE", Mlp, sgd, hook=dist.BuiltinCommHookType.ALLREDUCE)
    # Hooks written for torch's DDP chain futures the torch way: then(callback) calls callback(future),
    # which reads future.value(); torch's own fp16_compress_wrapper does.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    train_and_compare(hvd, c, "torch's fp16_compress_wrapper", Mlp, sgd, tol=2e-3, dtype=torch.float32,
                      hook=default_hooks.fp16_compress_wrapper(comm_hooks.allreduce_hook))
    # Around torch's own allreduce_hook, which would communicate through torch.distributed.
    train_and_compare(hvd, c, "torch's fp16_compress_wrapper(torch's allreduce_hook)", Mlp, sgd, tol=2e-3,
                      dtype=torch.float32, hook=default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook))
    train_and_compare(hvd, c, "torch's bf16_compress_wrapper(torch's allreduce_hook)", Mlp, sgd, tol=2e-2,
                      dtype=torch.float32, hook=default_hooks.bf16_compress_wrapper(default_hooks.allreduce_hook))

    def halved_sum_hook(state, bucket):  # an average written as a sum halved in a then() callback
        handle = hvd.allreduce_async_(bucket.buffer(), name=bucket.name(), op=hvd.Sum)
        return comm_hooks.HandleFuture(handle).then(lambda fut: fut.value() / hvd.size())

    train_and_compare(hvd, c, "torch-style then()", Mlp, sgd, hook=halved_sum_hook)


def check_complex(hvd, c):
    """Complex parameters and buffers travel as their real views, as torch.distributed sends them
    (they were refused as an unsupported dtype): the buffer is rank 0's after wrapping, and
    training matches one process."""
    from horo_torch.ddp import DistributedDataParallel
    size, rank = hvd.size(), hvd.rank()

    def offset_average(state, bucket):
        """Averages the buffer, and returns it at an odd offset of a larger tensor."""
        padded = torch.cat([bucket.buffer().new_zeros(1), bucket.buffer()])
        hvd.allreduce_(padded, op=hvd.Average, name=bucket.name())
        done = torch.futures.Future()
        done.set_result(padded[1:])
        return done

    for hook in (None, offset_average):
        what = "complex" if hook is None else "complex, a hook's result at an odd offset"
        torch.manual_seed(0)
        ref = Rotary()
        torch.manual_seed(0)
        model = Rotary()
        model.phase.mul_(rank + 1)  # differs per rank until the wrapper broadcasts rank 0's
        ddp = DistributedDataParallel(model, bucket_cap_mb=TINY_BUCKETS_MB)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        c.same(f"{what}: the buffer is rank 0's after wrapping", torch.equal(ddp.module.phase, ref.phase), True)
        ref_opt, opt = sgd(ref.parameters()), sgd(ddp.parameters())
        for step in range(3):
            reference_step(ref, ref_opt, step, size, torch.float64, False)
            opt.zero_grad()
            x, y = batch(step, size * BATCH, torch.float64)
            local_loss(ddp, rows(x, rank), rows(y, rank), rank).backward()
            opt.step()
            for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
                c.close(f"{what}: step {step} {name}", p.detach(), q.detach())


def check_unused_parameters(hvd, c):
    for opt_fn in (sgd, adam):
        ddp = train_and_compare(hvd, c, f"unused {opt_fn.__name__}", Branchy, opt_fn, find_unused=True, routed=True)
        c.same("gradient of a parameter no rank used stays None", ddp.module.never.weight.grad is None, True)
    # With no_sync: rank 0 uses rank0 only in the accumulated micro-batches of its own route.
    train_and_compare(hvd, c, "unused no_sync", Branchy, sgd, steps=2, find_unused=True, routed=True, micro=2)


def check_unused_without_flag(hvd, c):
    """find_unused_parameters=False and an unused parameter: a clear error, and no rank hangs."""
    from horo_torch.ddp import DistributedDataParallel
    rank = hvd.rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Branchy().double())
    x, y = batch(0, hvd.size() * BATCH, torch.float64)
    c.raises("unused on every rank", RuntimeError, "find_unused_parameters=True",
             lambda: local_loss(ddp, rows(x, rank), rows(y, rank), rank).backward())
    # Layer rank0 used on rank 0 only, every other parameter used everywhere: only the other ranks raise.
    torch.manual_seed(0)
    model = Branchy().double()
    del model.never
    model.branches = torch.nn.ModuleList([model.branches[0]])  # every rank takes route 0 below
    ddp = DistributedDataParallel(model)

    def step():
        ddp.zero_grad()
        local_loss(ddp, rows(x, rank), rows(y, rank), 0 if rank == 0 else 2).backward()  # route 0 everywhere

    if rank == 0:
        step()
        c.same("rank 0 completes", ddp.module.rank0.weight.grad is not None, True)
    else:
        c.raises("rank-0-only parameter on other ranks", RuntimeError, "rank0.weight", step)
    # The job goes on: every rank still takes part in collectives in step.
    total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum)
    c.same("collective after the error", total.item(), float(sum(range(hvd.size()))))


def check_state_broadcast(hvd, c):
    from horo_torch.ddp import DistributedDataParallel
    rank = hvd.rank()
    torch.manual_seed(rank)  # different parameters on every rank
    model = Mlp()
    model.register_buffer("counter", torch.full((2,), float(rank)))
    torch.manual_seed(0)
    want = Mlp()
    ddp = DistributedDataParallel(model)
    for p, q in zip(ddp.module.parameters(), want.parameters()):
        c.close("parameters broadcast from rank 0", p.detach(), q.detach(), 0.0)
    c.close("buffer broadcast at construction", model.counter, torch.zeros(2), 0.0)
    model.counter.fill_(rank + 5.0)
    ddp(torch.zeros(1, 5))
    c.close("buffer broadcast before forward", model.counter, torch.full((2,), 5.0), 0.0)

    # torch DDP's arguments: init_sync=False and broadcast_buffers=False leave every rank's own state.
    torch.manual_seed(rank)
    own = Mlp()
    own.register_buffer("counter", torch.full((2,), float(rank)))
    mine = [p.detach().clone() for p in own.parameters()]
    ddp = DistributedDataParallel(own, device_ids=None, output_device=None, dim=0, broadcast_buffers=False,
                                  init_sync=False, bucket_cap_mb=None, gradient_as_bucket_view=True,
                                  static_graph=True, check_reduction=False)
    ddp(torch.zeros(1, 5))
    c.same("init_sync=False keeps this rank's parameters",
           all(torch.equal(p.detach(), q) for p, q in zip(own.parameters(), mine)), True)
    c.close("broadcast_buffers=False keeps this rank's buffer", own.counter, torch.full((2,), float(rank)), 0.0)
    c.raises("device_ids of a CPU module", ValueError, "one device the module is on",
             lambda: DistributedDataParallel(Mlp(), device_ids=[0]))
    c.raises("a process group", ValueError, "process_set",
             lambda: DistributedDataParallel(Mlp(), process_group=object()))
    DistributedDataParallel(Mlp(), device_ids=["cpu"], output_device="cpu")  # the module's own device

    # A model that differs on one rank is an error on every rank at construction, as in torch DDP,
    # init_sync or not: its broadcasts and buckets would not match the others'.
    last = hvd.size() - 1
    more = torch.nn.Sequential(Mlp(), torch.nn.Linear(1, 1)) if rank == last else torch.nn.Sequential(Mlp())
    c.raises("a layer more on the last rank", RuntimeError, "params, while rank",
             lambda: DistributedDataParallel(more, init_sync=False))
    wide = torch.nn.Linear(3, 2 if rank == last else 4)
    c.raises("a wider layer on the last rank", RuntimeError, "appears not to match sizes and dtype",
             lambda: DistributedDataParallel(wide))
    counted = Mlp()
    if rank == last:
        counted.register_buffer("seen", torch.zeros(1))
    c.raises("a buffer more on the last rank", RuntimeError, "has inconsistent buffers",
             lambda: DistributedDataParallel(counted))
    DistributedDataParallel(Mlp())  # the ranks agree again afterwards


def check_hook_api(hvd, c):
    from horo_torch.ddp import DistributedDataParallel
    from horo_torch import comm_hooks
    rank = hvd.rank()

    def noop_hook(state, bucket):
        state.append(bucket.name())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    names = []
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Mlp().double(), bucket_cap_mb=TINY_BUCKETS_MB)
    ddp.register_comm_hook(names, noop_hook)
    c.raises("second hook", RuntimeError, "only be called once",
             lambda: ddp.register_comm_hook(None, comm_hooks.allreduce_hook))
    c.raises("hook not callable", TypeError, "callable",
             lambda: DistributedDataParallel(Mlp()).register_comm_hook(None, 3))
    import torch.distributed as dist
    c.raises("a builtin hook after a hook", RuntimeError, "only be called once",
             lambda: ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE))
    c.raises("a builtin hook by name", TypeError, "expected torch.distributed.BuiltinCommHookType",
             lambda: DistributedDataParallel(Mlp())._register_builtin_comm_hook("FP16_COMPRESS"))
    for kind, hook in ((dist.BuiltinCommHookType.ALLREDUCE, comm_hooks.allreduce_hook),
                       (dist.BuiltinCommHookType.FP16_COMPRESS, comm_hooks.fp16_compress_hook)):
        builtin = DistributedDataParallel(Mlp())
        builtin._register_builtin_comm_hook(kind)
        c.same(f"{kind} registers {hook.__name__}", builtin._comm_hook is hook, True)
    c.raises("bucket_cap_mb", ValueError, "negative", lambda: DistributedDataParallel(Mlp(), bucket_cap_mb=-1))
    c.same("bucket_cap_mb=0 (torch takes it): one parameter per bucket",
           len(DistributedDataParallel(Mlp(), bucket_cap_mb=0).buckets), 4)
    ignoring = Mlp()
    ignoring._ddp_params_and_buffers_to_ignore = ["fc1.bias"]
    c.same("torch DDP's bucket_bytes_cap and parameters_to_ignore",
           [DistributedDataParallel(Mlp()).bucket_bytes_cap, DistributedDataParallel(ignoring).parameters_to_ignore],
           [25 * 1024 * 1024, {"fc1.bias"}])
    # done() tells whether the collective completed, as torch's Future.done does (polled, not waited).
    future = comm_hooks.HandleFuture(hvd.allreduce_async(torch.ones(3), name="hook_api.done", op=hvd.Sum))
    for _ in range(10 ** 7):
        if future.done():
            break
    c.same("HandleFuture.done() turns True without wait()", future.done(), True)
    c.close("HandleFuture.value()", future.value(), torch.full((3,), float(hvd.size())), 0.0)
    torch.manual_seed(0)
    solo = Mlp().double()
    x, y = batch(3, hvd.size() * BATCH, torch.float64)
    local_loss(ddp, rows(x, rank), rows(y, rank), rank).backward()
    local_loss(solo, rows(x, rank), rows(y, rank), rank).backward()
    for p, q in zip(ddp.module.parameters(), solo.parameters()):
        c.close("a no-op hook leaves local gradients", p.grad, q.grad, 1e-12)
    c.same("one call per bucket, unique names", len(names) == len(set(names)) == len(ddp.buckets), True)


def check_outputs_left_out_and_static_graphs(hvd, c):
    """A model output the loss leaves out gives its parameters no gradient (None, not zeros: AdamW
    would decay them); static_graph=True allows unused parameters and a module run twice under
    reentrant checkpointing, as in torch DDP; a module with nothing to train is refused."""
    from horo_torch.ddp import DistributedDataParallel
    n, rank = hvd.size(), hvd.rank()

    def adamw(params):
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.5)

    torch.manual_seed(0)
    ref = TwoHeads().double()
    start = ref.head_b.weight.detach().clone()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(TwoHeads().double(), find_unused_parameters=True)
    ref_opt, opt = adamw(ref.parameters()), adamw(ddp.parameters())
    for step in range(3):
        x, y = batch(step, n * BATCH, torch.float64)
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x)[0], y).backward()
        ref_opt.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(rows(x, rank))[0], rows(y, rank)).backward()
        opt.step()
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        c.close(f"an output left out of the loss, AdamW: {name}", p.detach(), q.detach(), 1e-10)
    c.same("its head's gradient stays None and its weight where it started",
           (ddp.module.head_b.weight.grad is None, torch.equal(ddp.module.head_b.weight.detach(), start)),
           (True, True))
    torch.manual_seed(0)
    ddp = DistributedDataParallel(TwoHeads().double())
    x, y = batch(0, n * BATCH, torch.float64)
    c.raises("an output left out, without find_unused_parameters", RuntimeError, "head_b.weight",
             lambda: torch.nn.functional.mse_loss(ddp(rows(x, rank))[0], rows(y, rank)).backward())

    ddp = train_and_compare(hvd, c, "static_graph, parameters unused", Branchy, adam, routed=True,
                            static_graph=True)
    c.same("static_graph: a parameter no rank used keeps a None gradient", ddp.module.never.weight.grad is None, True)
    train_and_compare(hvd, c, "static_graph, a module run twice under reentrant checkpointing",
                      RunTwiceCheckpointed, sgd, static_graph=True)
    frozen = Mlp()
    frozen.requires_grad_(False)
    c.raises("nothing to train", RuntimeError, "DistributedDataParallel is not needed",
             lambda: DistributedDataParallel(frozen))


def check_process_set(hvd, c, pair):
    from horo_torch.ddp import DistributedDataParallel
    if pair.included():
        train_and_compare(hvd, c, "process set sgd", Mlp, sgd, steps=2, process_set=pair)
    else:
        c.raises("wrapper on a set without this rank", ValueError, "not a member",
                 lambda: DistributedDataParallel(Mlp(), process_set=pair))


def init_with_pair(hvd, size):
    """Initialises Horo with a process set of ranks 0 and 1 (the global set when size is 2); returns it."""
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair] if size > 2 else [])
    torch.set_num_threads(1)
    return pair if pair.process_set_id is not None else hvd.global_process_set


def run_groups(groups):
    """Runs each named group of checks, fn(checks), on this rank; a raising group is reported and the
    run goes on. Returns {name: (count, failures)}."""
    report = {}
    for name, fn in groups.items():
        c = Checks()
        try:
            fn(c)
        except Exception:  # noqa: BLE001 - reported; the run goes on with the next group
            c.failures.append(f"raised:\n{traceback.format_exc()}")
        report[name] = (c.count, c.failures)
    return report


def problems_in(reports):
    """The failures of every rank's report, and the groups in which no check ran."""
    problems = []
    for rank, report in enumerate(reports):
        for group, (count, failures) in report.items():
            problems += [f"rank {rank} {group}: {f}" for f in failures]
            if count == 0:
                problems.append(f"rank {rank} {group}: no check ran")
    return problems


def check_join(hvd, c):
    """Rank r has 2 + r batches. Inside join(), a rank whose batches ran out answers the others'
    allreduces with zeros; forward's buffers come from the highest rank still training (torch's
    choice); at the end
    every rank takes the model of the rank that left last. A single-process reference replays it."""
    import copy

    from horo_torch.ddp import DistributedDataParallel
    n, rank = hvd.size(), hvd.rank()
    steps = [2 + r for r in range(n)]
    for divide in (True, False):
        torch.manual_seed(0)
        ref = Normed().double()
        ddp = DistributedDataParallel(copy.deepcopy(ref), bucket_cap_mb=TINY_BUCKETS_MB)
        opt, ref_opt = sgd(ddp.parameters()), sgd(ref.parameters())
        with ddp.join(divide_by_initial_world_size=divide):
            for t in range(steps[rank]):
                x, y = batch(t, n * BATCH, torch.float64)
                opt.zero_grad()
                local_loss(ddp, rows(x, rank), rows(y, rank), rank).backward()
                opt.step()
        buffers = {r: [b.clone() for b in ref.buffers()] for r in range(n)}  # each rank's after its forward
        for t in range(max(steps)):
            training = [r for r in range(n) if t < steps[r]]
            synced = buffers[training[-1]]
            ref_opt.zero_grad()
            for r in training:
                with torch.no_grad():
                    for b, v in zip(ref.buffers(), synced):
                        b.copy_(v)
                x, y = batch(t, n * BATCH, torch.float64)
                (local_loss(ref, rows(x, r), rows(y, r), r) / (n if divide else len(training))).backward()
                buffers[r] = [b.clone() for b in ref.buffers()]
            ref_opt.step()
        what = f"join(divide_by_initial_world_size={divide})"
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            c.close(f"{what}: {name} is the last rank's, as trained by the reference", p.detach(), q.detach(), 1e-10)
        for (name, b), want in zip(ddp.module.named_buffers(), buffers[n - 1]):
            c.close(f"{what}: buffer {name}", b.double(), want.double(), 1e-10)

    # A registered hook decides the division itself, as in torch: a summing hook sums the ranks
    # still training, not rescaled by join(divide_by_initial_world_size=False).
    summed = DistributedDataParallel(torch.nn.Linear(2, 1, bias=False).double())

    def summing_hook(state, bucket):
        future = torch.futures.Future()
        future.set_result(hvd.allreduce(bucket.buffer(), op=hvd.Sum, name=f"summing.{bucket.index()}"))
        return future

    summed.register_comm_hook(None, summing_hook)
    with summed.join(divide_by_initial_world_size=False):
        for t in range(1 + rank):  # rank r trains r + 1 steps: only the last rank takes the final one
            summed.zero_grad()
            summed(torch.ones(1, 2, dtype=torch.float64)).sum().backward()
    # Rank r's last step is step r, in which the ranks from r up still train.
    c.close("join(divide_by_initial_world_size=False) leaves a registered hook's result as it is",
            summed.module.weight.grad, torch.full((1, 2), float(n - rank), dtype=torch.float64), 1e-12)

    # throw_on_early_termination: every rank raises once rank 0's inputs run out; the job goes on.
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Normed().double())

    def train_unevenly():
        with ddp.join(throw_on_early_termination=True):
            for t in range(1 if rank == 0 else 3):
                x, y = batch(t, n * BATCH, torch.float64)
                local_loss(ddp, rows(x, rank), rows(y, rank), rank).backward()

    c.raises("throw_on_early_termination", RuntimeError, "ran out of inputs", train_unevenly)

    # Rank 0 has no batch at all: it joins before the first synchronised backward, so it misses the
    # bucket rebuild the others do then; after join() it takes their buckets, and the next epoch's
    # collectives match (they would wait on each other's names otherwise).
    torch.manual_seed(0)
    reordered = DistributedDataParallel(Reordered().double(), bucket_cap_mb=TINY_BUCKETS_MB)
    opt = sgd(reordered.parameters())
    for counts in ([0] + [2] * (n - 1), [1] * n):
        with reordered.join():
            for t in range(counts[rank]):
                x, y = batch(t, n * BATCH, torch.float64)
                opt.zero_grad()
                local_loss(reordered, rows(x, rank), rows(y, rank), rank).backward()
                opt.step()
    layouts = hvd.allgather_object(reordered.buckets)
    c.same("every rank has the rebuilt buckets after a rank joined with no batch",
           (all(layout == layouts[0] for layout in layouts), reordered.buckets_rebuilt), (True, True))
    weights = hvd.allgather(reordered.module.head.weight.detach().unsqueeze(0))
    c.same("and the same parameters", all(torch.equal(w, weights[0]) for w in weights), True)
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
    c.same("a collective after the early termination", total.item(), float(n))
    with ddp.join(enable=False):
        local_loss(ddp, *batch(0, BATCH, torch.float64), rank).backward()
    c.same("join(enable=False) does nothing", ddp.module.fc1.weight.grad is not None, True)


class Embedded(torch.nn.Module):
    """An Mlp fed through an Embedding with sparse gradients (ids drawn from the inputs)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 5, sparse=True)
        self.fc = torch.nn.Linear(5, 3)

    def forward(self, x, rank=None):
        ids = (x.abs() * 3).long().clamp(max=9)
        return self.fc(self.emb(ids).mean(1))


def sparse_sgd(params):
    return torch.optim.SGD(params, lr=0.1)  # momentum-free: SGD takes sparse gradients then


def check_torch_ddp_behaviour(hvd, c, size):
    """What a torch DDP script relies on beyond the gradients: when buffers are synchronised, which
    backward passes communicate, torch's hooks and SyncBatchNorm, sparse embeddings, ignored
    parameters, copies, the constructor's arguments and torch.compile."""
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    from horo_torch.ddp import DistributedDataParallel
    from horo_torch.sync_batch_norm import SyncBatchNorm
    rank, n = hvd.rank(), hvd.size()
    x, y = batch(0, n * BATCH, torch.float64)
    mine = (rows(x, rank), rows(y, rank))

    # Evaluation under no_grad with a different number of batches per rank: the buffers are
    # broadcast at the first forward after training only (it hung when every forward broadcast).
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Normed().double())
    local_loss(ddp, *mine, rank).backward()
    ddp.eval()
    with torch.no_grad():
        for b in range(rank + 1):
            ddp(batch(b, BATCH, torch.float64)[0])
    ddp.train()
    local_loss(ddp, *mine, rank).backward()
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="ddp.after_uneven_eval")
    c.same("uneven no_grad evaluation, then training: no hang", total.item(), float(n))

    # A backward that no forward of the wrapper armed stays local: a second one through the same
    # graph, and one through the module alone on rank 0 only.
    torch.manual_seed(0)
    solo = Mlp().double()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Mlp().double())
    loss = local_loss(ddp, *mine, rank)
    loss.backward(retain_graph=True)
    averaged = [p.grad.clone() for p in ddp.parameters()]
    loss.backward()
    local_loss(solo, *mine, rank).backward()
    for p, a, q in zip(ddp.parameters(), averaged, solo.parameters()):
        c.close("a second backward through one forward adds the local gradient", p.grad, a + q.grad, 1e-12)
    ddp.zero_grad()
    if rank == 0:
        local_loss(ddp.module, *mine, rank).backward()
        solo.zero_grad()
        local_loss(solo, *mine, rank).backward()
        for p, q in zip(ddp.parameters(), solo.parameters()):
            c.close("a backward through the module alone is local", p.grad, q.grad, 1e-12)
    train_and_compare(hvd, c, "training after a rank-0-only backward", Mlp, sgd, steps=2)

    # torch's own hooks and SyncBatchNorm would talk through torch.distributed, which Horo does not
    # initialise: the default hooks map to Horo's, SyncBatchNorm layers become Horo's.
    train_and_compare(hvd, c, "torch's allreduce_hook", Mlp, sgd, hook=default_hooks.allreduce_hook)
    train_and_compare(hvd, c, "torch's fp16_compress_hook", Mlp, sgd, hook=default_hooks.fp16_compress_hook,
                      tol=2e-3, dtype=torch.float32)
    c.raises("torch's PowerSGD hook", NotImplementedError, "PowerSGD",
             lambda: DistributedDataParallel(Mlp()).register_comm_hook(None, powerSGD_hook.powerSGD_hook))

    # A hook of the user's that calls torch's default hook is not replaced: the error says what to
    # call instead (it was an AttributeError deep in torch.distributed).
    def logging_hook(state, bucket):
        return default_hooks.allreduce_hook(state, bucket)

    inside = DistributedDataParallel(Mlp().double())
    inside.register_comm_hook(None, logging_hook)
    c.raises("torch's default hook inside a hook of the user's", RuntimeError,
             "called torch.distributed (torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py:",
             lambda: local_loss(inside, *mine, rank).backward())
    c.raises("... and the error names Horo's hooks", RuntimeError, "call horo_torch.comm_hooks' allreduce_hook",
             lambda: local_loss(inside, *mine, rank).backward())

    # torch DDP's _get_ddp_logging_data()["can_set_static_graph"], the check its docs give for
    # static_graph: there once a backward has run, 0 when the parameters used change between them.
    torch.manual_seed(0)
    steady = DistributedDataParallel(Branchy().double(), find_unused_parameters=True)
    changing = DistributedDataParallel(Branchy().double(), find_unused_parameters=True)
    c.same("no can_set_static_graph before a backward", "can_set_static_graph" in steady._get_ddp_logging_data(),
           False)
    for step in range(3):
        local_loss(steady, *mine, rank).backward()
        local_loss(changing, *mine, step % 2).backward()  # the route, so the parameters used, changes
    c.same("can_set_static_graph: the same parameters in every backward, or not",
           [d._get_ddp_logging_data()["can_set_static_graph"] for d in (steady, changing)], [1, 0])
    logged = steady._get_ddp_logging_data()
    c.same("logging data of the constructor's arguments",
           [logged["find_unused_parameters"], logged["static_graph"], logged["bucket_cap_bytes"]],
           [1, 0, 25 * 1024 * 1024])
    torch.manual_seed(0)
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(Normed().double())
    ddp = DistributedDataParallel(model)
    c.same("torch.nn.SyncBatchNorm becomes Horo's", type(ddp.module.norm), SyncBatchNorm)
    hidden = ddp.module.fc1(mine[0])
    whole = torch.nn.functional.batch_norm(ddp.module.fc1(x), None, None, training=True)
    c.close("... and normalises over every rank's batch", ddp.module.norm(hidden), rows(whole, rank), 1e-10)

    # Embedding(sparse=True): the gradient stays sparse and is averaged.
    ddp = train_and_compare(hvd, c, "sparse embedding", Embedded, sparse_sgd, steps=2)
    local_loss(ddp, *mine, rank).backward()
    c.same("the embedding's gradient is sparse", ddp.module.emb.weight.grad.is_sparse, True)

    # Buffers at construction: broadcast_buffers=False leaves them rank-local, forward_sync_buffers
    # =False still takes root's (torch 2.13's rule); parameters named in
    # _ddp_params_and_buffers_to_ignore are neither broadcast nor reduced.
    for kwargs, want in (({"broadcast_buffers": False}, float(rank)), ({"forward_sync_buffers": False}, 0.0)):
        model = Mlp().double()
        model.register_buffer("mark", torch.tensor([float(rank)]))
        ddp = DistributedDataParallel(model, **kwargs)
        ddp(mine[0])
        c.same(f"{kwargs}: buffer after construction and a forward", ddp.module.mark.item(), want)
    model = Mlp().double()
    with torch.no_grad():
        model.fc2.bias.fill_(rank)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["fc2.bias"])
    ddp = DistributedDataParallel(model)
    c.same("an ignored parameter is not broadcast", ddp.module.fc2.bias.tolist(), [float(rank)] * 3)
    local_loss(ddp, *mine, rank).backward()
    solo = copy.deepcopy(ddp.module)
    solo.zero_grad()
    local_loss(solo, *mine, rank).backward()
    c.close("an ignored parameter's gradient stays local", ddp.module.fc2.bias.grad, solo.fc2.bias.grad, 1e-12)

    # A deep copy (as for an EMA or evaluation copy) is a working wrapper of its own.
    torch.manual_seed(0)
    ref = Mlp().double()
    torch.manual_seed(0)
    twin = copy.deepcopy(DistributedDataParallel(Mlp().double()))
    local_loss(twin, *mine, rank).backward()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    for p, q in zip(twin.parameters(), ref.parameters()):
        c.close("a deep-copied wrapper averages its gradients", p.grad, q.grad, 1e-10)

    # Reentrant activation checkpointing runs a backward per checkpointed segment: the end of
    # backward is the outermost one's, a segment first in backward included; a module run twice
    # under it gets a clear error instead of a stale gradient. A gradient penalty
    # (torch.autograd.grad through the outputs) leaves the training backward armed.
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self, twice=False):
            super().__init__()
            self.fc1, self.fc2, self.twice = torch.nn.Linear(5, 5), torch.nn.Linear(5, 3), twice

        def forward(self, x, rank=None):
            x = torch.tanh(self.fc1(x))
            for _ in range(2 if self.twice else 1):
                x = checkpoint(lambda t: torch.tanh(self.fc2(t) if t.shape[1] == 5 else t), x, use_reentrant=True)
            return x

    train_and_compare(hvd, c, "reentrant checkpoint as the last layer", Checkpointed, sgd, steps=2)
    torch.manual_seed(0)
    model = Checkpointed()
    model.fc3 = torch.nn.Linear(3, 3)
    model.forward = lambda x, rank=None: checkpoint(lambda t: model.fc3(t), checkpoint(
        lambda t: model.fc3(t), torch.tanh(model.fc2(torch.tanh(model.fc1(x)))), use_reentrant=True),
        use_reentrant=True)
    ddp = DistributedDataParallel(model.double(), bucket_cap_mb=TINY_BUCKETS_MB)
    c.raises("a module run twice under reentrant checkpointing", RuntimeError, "use_reentrant=False",
             lambda: local_loss(ddp, *mine, rank).backward())
    torch.manual_seed(0)
    ref = Mlp().double()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Mlp().double())
    inputs = mine[0].clone().requires_grad_()
    loss = local_loss(ddp, inputs, mine[1], rank)
    (penalty,) = torch.autograd.grad(loss, inputs, create_graph=True)
    (loss + penalty.pow(2).sum()).backward()
    ref_inputs = [rows(x, r).clone().requires_grad_() for r in range(n)]
    total = 0
    for r, xi in enumerate(ref_inputs):
        ref_loss = local_loss(ref, xi, rows(y, r), r)
        (g,) = torch.autograd.grad(ref_loss, xi, create_graph=True)
        total = total + (ref_loss + g.pow(2).sum()) / n
    total.backward()
    for p, q in zip(ddp.parameters(), ref.parameters()):
        c.close("a gradient penalty through autograd.grad", p.grad, q.grad, 1e-10)

    # The wrapper itself under non-reentrant checkpointing: its forward runs again inside backward
    # (a recompute, which must not touch the iteration), step after step.
    torch.manual_seed(0)
    ref = Mlp().double()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Mlp().double())
    for step in range(2):
        ddp.zero_grad()
        ref.zero_grad()
        xs, ys = batch(step, n * BATCH, torch.float64)
        torch.nn.functional.mse_loss(checkpoint(ddp, rows(xs, rank), use_reentrant=False), rows(ys, rank)).backward()
        torch.nn.functional.mse_loss(ref(xs), ys).backward()
        for p, q in zip(ddp.parameters(), ref.parameters()):
            c.close(f"checkpoint(wrapper) step {step}", p.grad, q.grad, 1e-10)
    # A copy and its original in one backward: each has names of its own.
    twin = copy.deepcopy(ddp)
    ddp.zero_grad()
    twin.zero_grad()
    (local_loss(ddp, *mine, rank) + local_loss(twin, *mine, rank)).backward()
    for p, q in zip(ddp.parameters(), twin.parameters()):
        c.close("a copy and its original reduce side by side", p.grad, q.grad, 1e-12)

    # torch 2.13's other constructor arguments.
    ddp = DistributedDataParallel(Mlp(), static_graph=True, skip_all_reduce_unused_params=True,
                                  bucket_cap_mb_list=[1], batched_grad_copy=True, forward_sync_buffers=True)
    c.same("torch's attributes", (ddp.device, ddp.process_group, ddp.static_graph, ddp.broadcast_buffers),
           (torch.device("cpu"), None, True, True))
    c.raises("mixed_precision", NotImplementedError, "autocast",
             lambda: DistributedDataParallel(Mlp(), mixed_precision=object()))
    c.raises("device_mesh", ValueError, "process_set", lambda: DistributedDataParallel(Mlp(), device_mesh=object()))
    c.raises("delay_all_reduce_named_params alone", ValueError, "same time",
             lambda: DistributedDataParallel(Mlp(), delay_all_reduce_named_params=[]))

    if size == 2:  # compiling takes seconds; once is enough
        # torch.compile of the wrapper: the buffer broadcast runs outside the graph.
        torch.manual_seed(0)
        ref = Mlp().double()
        torch.manual_seed(0)
        model = Mlp().double()
        model.register_buffer("mark", torch.tensor([float(rank)]))
        compiled = torch.compile(DistributedDataParallel(model))
        local_loss(compiled, *mine, rank).backward()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        for p, q in zip(compiled.parameters(), ref.parameters()):
            c.close("torch.compile(wrapper) with buffers", p.grad, q.grad, 1e-10)
        c.same("... whose buffers are broadcast", model.mark.item(), 0.0)


RUN_ENV = {"HORO_PEER_TIMEOUT_SECONDS": "60", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "60"}


def run_checks(size):
    import horo_torch as hvd

    pair = init_with_pair(hvd, size)
    layouts = {}
    report = run_groups({
        "equivalence": lambda c: check_equivalence(hvd, c),
        "bucket_rebuild": lambda c: check_bucket_rebuild(hvd, c, layouts),
        "no_sync": lambda c: check_no_sync(hvd, c),
        "wrapped_again": lambda c: check_wrapped_again(hvd, c),
        "compression_hooks": lambda c: check_compression_hooks(hvd, c),
        "complex": lambda c: check_complex(hvd, c),
        "unused_parameters": lambda c: check_unused_parameters(hvd, c),
        "unused_without_flag": lambda c: check_unused_without_flag(hvd, c),
        "state_broadcast": lambda c: check_state_broadcast(hvd, c),
        "hook_api": lambda c: check_hook_api(hvd, c),
        "outputs_left_out_and_static_graphs": lambda c: check_outputs_left_out_and_static_graphs(hvd, c),
        "process_set": lambda c: check_process_set(hvd, c, pair),
        "join": lambda c: check_join(hvd, c),
        "torch_ddp_behaviour": lambda c: check_torch_ddp_behaviour(hvd, c, size),
    })
    hvd.barrier()
    hvd.shutdown()
    return report, layouts


@pytest.mark.parametrize("size", SIZES, ids=[f"np{n}" for n in SIZES])
def test_ddp_matches_single_process(size):
    results = horo_runner.run(run_checks, args=(size,), num_proc=size, env=RUN_ENV)
    problems = problems_in([report for report, _ in results])
    assert not problems, "\n".join(problems[:40])
    layouts = [layout for _, layout in results]
    assert all(layout == layouts[0] for layout in layouts), f"ranks disagree on buckets: {layouts}"
    assert layouts[0]["rebuilt"] != layouts[0]["initial"]


def test_inputs_follow_device_ids():
    """torch DDP moves a single-device module's inputs to device_ids[0]; the meta device stands in
    for a GPU here."""
    from collections import namedtuple

    from horo_torch.ddp import _check_devices, _to_device
    module = torch.nn.Linear(2, 2).to("meta")
    assert _check_devices(module, ["meta"], None) == torch.device("meta")
    assert _check_devices(module, None, "meta") is None
    with pytest.raises(ValueError, match="one device the module is on"):
        _check_devices(module, ["cpu"], None)
    Pair = namedtuple("Pair", "a b")
    moved = _to_device(([torch.ones(1)], {"k": Pair(torch.ones(2), 3)}, "text"), torch.device("meta"))
    assert moved[0][0].device.type == "meta" and moved[1]["k"].a.device.type == "meta"
    assert moved[1]["k"].b == 3 and moved[2] == "text" and isinstance(moved[1]["k"], Pair)


def test_importing_horo_torch_leaves_torch_compile_unloaded():
    """torch._dynamo (2 s of CPU to import) stays unloaded through a forward and backward pass of
    the wrapper with SyncBatchNorm and an allreduce, so that Horo makes no script that never compiles
    pay for it at every rank's start (horo_torch/_compile.py). (Making a torch optimizer imports
    it: torch.optim's own doing.)"""
    import os
    import subprocess
    import sys
    probe = ("import sys, torch, horo_torch as hvd\n"
             "print('torch._dynamo' in sys.modules)\n"
             "hvd.init()\n"
             "model = hvd.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(2, 2), hvd.SyncBatchNorm(2)))\n"
             "model(torch.ones(4, 2)).sum().backward()\n"
             "hvd.allreduce(torch.ones(2))\n"
             "print('torch._dynamo' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "False"], out.stdout
