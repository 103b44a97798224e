"""DistributedOptimizer: N ranks with batch b each must train exactly like one process on N*b.

One ``horo_runner.run`` per world size runs every scenario on every rank (process start-up
dominates the cost on small machines). Each rank trains the distributed model on its shard and,
on its own, the single-process reference on the concatenated batch from the same seed and data;
it reports the largest parameter difference after STEPS steps, which the test compares with a
tolerance: float32 round-off for exact reductions, a looser one for fp16/bf16 compression. So that
no scenario passes by accident, the parameters must also have moved by far more than the tolerance,
and a control (the same optimizer on the local shard only, no reduction) must miss the reference by
far more than the loosest tolerance.
"""
import warnings

import pytest
import torch

import horo_runner

STEPS = 5
SHARD = 4          # samples per rank per step
FEATURES, HIDDEN, CLASSES = 6, 16, 4
EXACT = 2e-5       # float32 round-off after STEPS steps
TOLERANCE = {"fp16": 5e-4, "bf16": 2e-3}  # measured: 3e-5 and 1.3e-4
ENV = {"HORO_STALL_SHUTDOWN_TIME_SECONDS": "60", "HORO_PEER_TIMEOUT_SECONDS": "60"}


class Net(torch.nn.Module):
    """A small MLP; with branches=True rank r also uses head (r % 2), so each head is unused on some ranks."""

    def __init__(self, branches=False):
        super().__init__()
        torch.manual_seed(1234)
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, CLASSES)
        self.heads = torch.nn.ModuleList([torch.nn.Linear(HIDDEN, CLASSES) for _ in range(2)]) if branches else None
        self.unused = torch.nn.Parameter(torch.ones(3)) if branches else None

    def forward(self, x, branch=None):
        h = torch.tanh(self.fc1(x))
        out = self.fc2(h)
        return out if branch is None else out + self.heads[branch](h)


class SparseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(99)
        self.embedding = torch.nn.Embedding(20, 5, sparse=True)
        self.fc = torch.nn.Linear(5, CLASSES)

    def forward(self, ids):
        return self.fc(self.embedding(ids).mean(1))


def global_batch(step, size, sparse=False):
    """The step's batch for all ranks together; rank r's shard is rows [r*SHARD, (r+1)*SHARD)."""
    g = torch.Generator().manual_seed(1000 + step)
    n = SHARD * size
    x = torch.randint(0, 20, (n, 3), generator=g) if sparse else torch.randn(n, FEATURES, generator=g)
    return x, torch.randint(0, CLASSES, (n,), generator=g)


def shard(tensor, rank):
    return tensor[rank * SHARD:(rank + 1) * SHARD]


def loss_of(model, x, y, branch):
    return torch.nn.functional.cross_entropy(model(x) if branch is None else model(x, branch), y)


def sgd(params, lr=0.1):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def adam(params, lr=0.01):
    return torch.optim.Adam(params, lr=lr)


def sgd_plain(params):
    """SGD without momentum, for sparse gradients."""
    return torch.optim.SGD(params, lr=0.5)


def max_difference(a, b):
    return max((pa.detach() - pb.detach()).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))


def train_reference(make_model, make_opt, size, branches, sparse=False):
    """One process, the concatenated batch of all ranks (per-rank heads when branches)."""
    model = make_model()
    opt = make_opt(model.parameters())
    for step in range(STEPS):
        x, y = global_batch(step, size, sparse)
        opt.zero_grad()
        if branches:
            loss = sum(loss_of(model, shard(x, r), shard(y, r), r % 2) for r in range(size)) / size
        else:
            loss = loss_of(model, x, y, None)
        loss.backward()
        opt.step()
    return model


def train_distributed(make_model, make_opt, size, rank, branches, sparse=False, passes=1, local_only=False,
                      **options):
    """This rank's shard through DistributedOptimizer (or the plain optimizer when local_only)."""
    import horo_torch as hvd
    model = make_model()
    opt = make_opt(model.parameters())
    if not local_only:
        groups = options.pop("groups", None)
        if callable(groups):
            groups = groups(model)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), backward_passes_per_step=passes,
                                       groups=groups, **options)
    branch = rank % 2 if branches else None
    for step in range(STEPS):
        x, y = global_batch(step, size, sparse)
        x, y = shard(x, rank), shard(y, rank)
        opt.zero_grad()
        micro = SHARD // passes
        for i in range(passes):
            (loss_of(model, x[i * micro:(i + 1) * micro], y[i * micro:(i + 1) * micro], branch) / passes).backward()
        opt.step()
    return model


def equivalence_scenarios(size):
    """name -> (model factory, reference optimizer, distributed optimizer, options, tolerance)."""
    def net():
        return Net()

    def branch_net():
        return Net(branches=True)

    def sum_sgd(params):
        return sgd(params, lr=0.1 / size)  # Sum gives size times the average gradient; SGD is linear in it

    return {
        "sgd momentum": (net, sgd, sgd, {}, EXACT),
        "adam": (net, adam, adam, {}, EXACT),
        "sgd backward_passes_per_step=2": (net, sgd, sgd, {"passes": 2}, EXACT),
        "adam backward_passes_per_step=2": (net, adam, adam, {"passes": 2}, EXACT),
        "sgd groups=2": (net, sgd, sgd, {"groups": 2}, EXACT),
        "adam groups=list": (net, adam, adam, {"groups": lambda m: [[m.fc1.weight, m.fc2.bias], [m.fc1.bias]]}, EXACT),
        "sgd fp16": (net, sgd, sgd, {"compression": "fp16"}, TOLERANCE["fp16"]),
        "adam bf16": (net, adam, adam, {"compression": "bf16"}, TOLERANCE["bf16"]),
        "sgd gradient_predivide_factor=2": (net, sgd, sgd, {"gradient_predivide_factor": 2.0}, EXACT),
        "adam gradient_predivide_factor=4": (net, adam, adam, {"gradient_predivide_factor": 4.0}, EXACT),
        "sgd op=Sum with lr/size": (net, sgd, sum_sgd, {"op": "Sum"}, EXACT),
        "sgd rank-dependent branch": (branch_net, sgd, sgd, {"branches": True}, EXACT),
        "adam rank-dependent branch": (branch_net, adam, adam, {"branches": True}, EXACT),
        "sgd rank-dependent branch, groups across heads": (
            branch_net, sgd, sgd,
            {"branches": True, "groups": lambda m: [[m.heads[0].weight, m.heads[1].weight, m.fc1.weight]]}, EXACT),
        "sparse embedding by allgather": (SparseNet, sgd_plain, sgd_plain, {"sparse": True}, EXACT),
        "sparse embedding as dense": (SparseNet, sgd_plain, sgd_plain, {"sparse": True, "sparse_as_dense": True},
                                      EXACT),
    }


def run_equivalence(size, rank):
    import horo_torch as hvd
    results = {}
    for name, (make_model, ref_opt, dist_opt, options, tolerance) in equivalence_scenarios(size).items():
        options = dict(options)
        if "compression" in options:
            options["compression"] = getattr(hvd.Compression, options["compression"])
        if "op" in options:
            options["op"] = getattr(hvd, options["op"])
        branches, sparse = options.pop("branches", False), options.pop("sparse", False)
        reference = train_reference(make_model, ref_opt, size, branches, sparse)
        distributed = train_distributed(make_model, dist_opt, size, rank, branches, sparse, **options)
        moved = max_difference(distributed, make_model())
        results[name] = (max_difference(reference, distributed), tolerance, moved)
    # Controls: without reduction the shard-only run is far from the reference.
    for name, make_opt in (("control sgd", sgd), ("control adam", adam)):
        reference = train_reference(Net, make_opt, size, False)
        local = train_distributed(Net, make_opt, size, rank, False, local_only=True)
        results[name] = max_difference(reference, local)
    return results


# Behaviour checks (one world of 2 ranks) ---------------------------------------------------------

def capture(fn):
    """(exception type name, message) raised by fn, or None."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test compares type and text
        return type(exc).__name__, str(exc), [c.__name__ for c in type(exc).__mro__]
    return None


def run_behaviour(size, rank):
    import horo_torch as hvd
    report = {}

    def fresh(**options):
        model = Net()
        return model, hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                               **options)

    x, y = global_batch(0, size)
    x, y = shard(x, rank), shard(y, rank)

    model, opt = fresh()
    report["class"] = (type(opt).__name__, isinstance(opt, torch.optim.SGD), opt.param_groups[0]["lr"])
    calls = []
    opt.register_step_pre_hook(lambda *a: calls.append("pre"))
    opt.register_step_post_hook(lambda *a: calls.append("post"))
    loss_of(model, x, y, None).backward()
    report["started during backward"] = sorted(len(s.params) for s in opt._handles.values())
    report["zero_grad while pending"] = capture(opt.zero_grad)
    opt.step()
    report["step hooks"] = calls
    opt.zero_grad(set_to_none=False)
    report["zero_grad(set_to_none=False)"] = all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.zero_grad()
    report["zero_grad()"] = all(p.grad is None for p in model.parameters())

    # backward_passes_per_step: nothing starts before the last pass; one pass too many is an error.
    model, opt = fresh(backward_passes_per_step=2)
    loss_of(model, x, y, None).backward()
    after_first = len(opt._handles)
    loss_of(model, x, y, None).backward()
    report["passes=2 handles after 1st/2nd backward"] = (after_first, len(opt._handles))
    report["third backward"] = capture(lambda: loss_of(model, x, y, None).backward())
    opt.synchronize()
    opt.set_backward_passes_per_step(1)
    opt.zero_grad()
    loss_of(model, x, y, None).backward()
    report["after set_backward_passes_per_step(1)"] = len(opt._handles)
    opt.step()
    report["set_backward_passes_per_step(0)"] = capture(lambda: opt.set_backward_passes_per_step(0))

    # synchronize() then step(): warned, and gradients are not reduced a second time (Sum would double them).
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), op=hvd.Sum)
    model(torch.full((1, 2), float(rank + 1))).sum().backward()
    opt.synchronize()
    reduced = model.weight.grad.tolist()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    report["step after synchronize"] = (reduced, model.weight.tolist(), [str(w.message) for w in caught])
    opt.zero_grad()
    model(torch.full((1, 2), float(rank + 1))).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught, opt.skip_synchronize():
        warnings.simplefilter("always")
        opt.step()
    report["skip_synchronize"] = (model.weight.tolist(), len(caught))
    # synchronize() and no step (a step skipped for a non-finite gradient norm), then an iteration
    # in which only rank 0 has data: its step reduces on every rank, the other rank's gradient as
    # zeros, whether the gradients were cleared through the optimizer or the model. (A rank that
    # ran no backward kept the gradients of the skipped iteration and took them for reduced ones:
    # the ranks then paired different iterations' reductions and hung at the end.)
    for clear in ("optimizer", "model"):
        with torch.no_grad():
            model.weight.fill_(0.0)
        opt.zero_grad()
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        opt.synchronize()
        (opt if clear == "optimizer" else model).zero_grad()
        if rank == 0:
            model(torch.full((1, 2), 5.0)).sum().backward()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        report[f"skipped step, then only rank 0 computes ({clear}.zero_grad)"] = (
            model.weight.tolist(), [str(w.message) for w in caught])
    # Changes in place after synchronize() (GradScaler.unscale_, clipping) keep the iteration: a
    # step() without skip_synchronize() warns and does not reduce again (Sum would multiply by 2).
    with torch.no_grad():
        model.weight.fill_(0.0)
    opt.zero_grad()
    model(torch.full((1, 2), float(rank + 1))).sum().backward()
    opt.synchronize()
    model.weight.grad.mul_(0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    report["step after synchronize and an unscale in place"] = (model.weight.tolist(), len(caught))

    # An LR scheduler made on the optimizer before it is wrapped (torch patches the original's
    # step): step() still reduces, the scheduler's rate reaches the wrapper, and it does not warn.
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    plain = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(plain, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(plain, named_parameters=model.named_parameters(), op=hvd.Sum)
    # Horovod's recipe: the non-root ranks load root's state (new param_groups), which the
    # scheduler's rates must still reach.
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            model(torch.full((1, 2), float(rank + 1))).sum().backward()
            opt.step()
            scheduler.step()
            opt.zero_grad()
    report["scheduler made before wrapping"] = (model.weight.tolist(), opt.param_groups[0]["lr"],
                                                [str(w.message) for w in caught])

    # A dropped wrapper takes its gradient hooks with it: the same model wrapped again trains.
    import gc

    def gradient_hooks(p):
        """How many hooks the node that accumulates p's gradient carries (besides a probe's)."""
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        probe = accumulator.register_hook(lambda *unused: None)
        count = len(probe.hooks_dict_ref()) - 1
        probe.remove()
        return count

    hooks_with_wrapper = gradient_hooks(model.weight)
    del opt, scheduler
    gc.collect()
    report["hooks with the wrapper, after it is dropped"] = (hooks_with_wrapper, gradient_hooks(model.weight))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters(),
                                   op=hvd.Sum)
    for _ in range(2):
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        opt.step()
        opt.zero_grad()
    report["wrapped again"] = model.weight.tolist()

    # Dropped between backward() and step(): its reduction in flight is let go once it completes,
    # with the gradient it holds. Rank 1 computes its gradient only after rank 0 has dropped its
    # optimizer and looked: until then the reduction cannot complete, and nothing may be released.
    import weakref
    from horo_torch import _handles as handles
    before = set(handles._handle_map)
    dropped = torch.nn.Linear(2, 1, bias=False)
    opt_dropped = hvd.DistributedOptimizer(torch.optim.SGD(dropped.parameters(), lr=1.0),
                                           named_parameters=dropped.named_parameters(), op=hvd.Sum)

    def backward_and_drop():
        nonlocal opt_dropped
        dropped(torch.ones(1, 2)).sum().backward()
        grad = weakref.ref(dropped.weight.grad)
        opt_dropped = None
        gc.collect()
        dropped.weight.grad = None
        return set(handles._handle_map) - before, grad

    held = None
    if rank == 0:
        in_flight, grad = backward_and_drop()
        handles._release_abandoned()  # what the next operation's start or synchronize does
        held = (bool(in_flight <= set(handles._handle_map)), grad() is not None)
    hvd.broadcast_object(None, root_rank=0, name="dropped.go")
    if rank != 0:
        in_flight, grad = backward_and_drop()
    for handle in in_flight:  # wait for the core's operations themselves (raises after 60 s)
        pending = handles._handle_map[handle]
        for core_handle in pending.core_handles:
            pending.runtime.wait(core_handle, timeout=60)
        del pending  # it holds the gradient
    hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="after.dropped"))
    report["dropped in flight"] = (len(in_flight), held, bool(in_flight & set(handles._handle_map)), grad() is None)

    # A parameter no rank uses still gets a (zero) gradient and nobody waits for it.
    model = Net(branches=True)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    loss_of(model, x, y, rank % 2).backward()
    opt.synchronize()
    report["unused everywhere"] = (model.unused.grad.tolist(), model.heads[1 - rank % 2].weight.grad.abs().sum().item()
                                   > 0)

    # A sparse gradient one rank did not compute: after the first step it is reduced as an empty sparse tensor.
    model = SparseNet()
    opt = hvd.DistributedOptimizer(sgd_plain(model.parameters()), named_parameters=model.named_parameters())
    ids, labels = global_batch(0, size, sparse=True)
    loss_of(model, shard(ids, rank), shard(labels, rank), None).backward()
    opt.step()
    opt.zero_grad()
    if rank == 0:
        loss_of(model, shard(ids, 0), shard(labels, 0), None).backward()
    else:
        model.fc(torch.ones(1, 5)).sum().backward()
    opt.synchronize()
    local = SparseNet()
    local.load_state_dict(model.state_dict())
    loss_of(local, shard(ids, 0), shard(labels, 0), None).backward()
    expected = local.embedding.weight.grad.to_dense() / size
    grad = model.embedding.weight.grad
    report["sparse gradient missing on rank 1"] = (grad.is_sparse, (grad.to_dense() - expected).abs().max().item())

    # load_state_dict keeps working and restores the state exactly.
    model, opt = fresh()
    loss_of(model, x, y, None).backward()
    opt.step()
    saved = opt.state_dict()
    model2, opt2 = fresh()
    loss_of(model2, x, y, None).backward()
    opt2.load_state_dict(saved)
    report["load_state_dict"] = (not opt2._handles,
                                 all(torch.equal(opt2.state_dict()["state"][i]["momentum_buffer"],
                                                 saved["state"][i]["momentum_buffer"]) for i in saved["state"]))

    # Parameters that train only after wrapping (unfrozen, or added to the optimizer) are not reduced,
    # as under Horovod: each rank trains them alone, which was silent. Now a warning names them, once.
    model = Net()
    model.fc1.bias.requires_grad_(False)
    opt = hvd.DistributedOptimizer(sgd(model.fc2.parameters()), named_parameters=model.fc2.named_parameters())
    model.fc1.bias.requires_grad_(True)
    opt.add_param_group({"params": [model.fc1.bias]})
    caught = []
    for _ in range(2):
        opt.zero_grad()
        loss_of(model, x, y, None).backward()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opt.step()
        caught += [str(w.message) for w in seen]
    report["trainable after wrapping"] = caught

    # A hook the user registers on a parameter after wrapping (here halving its gradient in place)
    # finishes before the reduction reads the gradient, as under Horovod: every step applies half the
    # average on every rank. Hung on the parameter, behind Horo's own hook, it raced the reduction.
    model = torch.nn.Linear(64, 64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())

    def halve(p):
        p.grad.mul_(0.5)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(halve)
    hvd.broadcast_parameters(model.state_dict(), 0)
    wrong = 0
    for step in range(20):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(100 * step + rank))
        raw = torch.autograd.grad(model(x).sum(), list(model.parameters()))  # runs no hook
        expected = [0.5 * hvd.allreduce(g, name=f"hooked.{step}.{i}") for i, g in enumerate(raw)]
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        wrong += sum(not torch.allclose(b - p.detach(), e, rtol=1e-5, atol=1e-7)
                     for b, p, e in zip(before, model.parameters(), expected))
    report["user hook after wrapping: wrong updates"] = wrong

    # Validation, as Horovod.
    def bad(**options):
        model = Net()
        return lambda: hvd.DistributedOptimizer(sgd(model.parameters()), **options)

    def frozen_on_rank_zero(**options):  # rank 1 alone would reduce fc1.bias, and wait for ever
        model = Net()
        model.fc1.bias.requires_grad_(rank != 0)
        return lambda: hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                                **options)

    # A compression that raises on rank 1 alone: rank 1's backward raises, and the other rank's step
    # gets the same error instead of waiting for rank 1's gradient (one gradient, so that no other
    # reduction is left waiting for the rank whose backward stopped).
    class Failing:
        @staticmethod
        def compress(tensor):
            raise ValueError("no room")

    lone = torch.nn.Linear(2, 1, bias=False)
    failing = hvd.DistributedOptimizer(sgd(lone.parameters()), named_parameters=lone.named_parameters(),
                                       compression=Failing if rank == 1 else hvd.Compression.none)
    report["compression that raises on rank 1"] = capture(
        lambda: (lone(torch.ones(1, 2)).sum().backward(), failing.step()))

    m = Net()
    named = list(m.named_parameters())
    report["errors"] = {
        "frozen on rank 0 only": capture(frozen_on_rank_zero()),
        "frozen on rank 0 only, groups=1": capture(frozen_on_rank_zero(groups=1)),
        "not tuples": capture(lambda: hvd.DistributedOptimizer(sgd(m.parameters()),
                                                               named_parameters=[p for _, p in named])),
        "duplicates": capture(lambda: hvd.DistributedOptimizer(
            sgd(m.parameters()), named_parameters=[("w", p) for _, p in named])),
        "unnamed": capture(lambda: hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=named[:2])),
        "predivide with Sum": capture(bad(op=hvd.Sum, gradient_predivide_factor=2.0)),
        "predivide <= 0": capture(bad(gradient_predivide_factor=0.0)),
        "passes 0": capture(bad(backward_passes_per_step=0)),
        "groups -1": capture(bad(groups=-1)),
        "groups of non-tensors": capture(bad(groups=[["fc1.weight"]])),
        "parameter twice in groups": capture(lambda: hvd.DistributedOptimizer(
            sgd(m.parameters()), groups=[[m.fc1.weight], [m.fc1.weight]])),
        "unknown op": capture(bad(op=42)),
    }
    return report


def run_all(equivalence_only=False):
    import horo_torch as hvd
    torch.set_num_threads(1)  # tiny tensors; several ranks share few cores
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    result = {"equivalence": run_equivalence(size, rank)}
    if not equivalence_only:
        result["behaviour"] = run_behaviour(size, rank)
    hvd.shutdown()
    return result


def check_equivalence(reports):
    failures = []
    for rank, report in enumerate(reports):
        for name, value in report["equivalence"].items():
            if name.startswith("control"):
                if not value > 10 * max(TOLERANCE.values()):
                    failures.append(f"rank {rank} {name}: shard-only training is only {value:.2e} from the reference")
                continue
            difference, tolerance, moved = value
            if not difference <= tolerance:
                failures.append(f"rank {rank} {name}: parameters differ by {difference:.3e} > {tolerance:.0e}")
            if not moved > 10 * tolerance:
                failures.append(f"rank {rank} {name}: parameters moved only {moved:.3e} from their initial values")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def two_rank_reports():
    return horo_runner.run(run_all, num_proc=2, env=ENV)


def test_two_ranks_train_like_one_process_on_the_whole_batch(two_rank_reports):
    check_equivalence(two_rank_reports)


def test_three_ranks_train_like_one_process_on_the_whole_batch():
    check_equivalence(horo_runner.run(run_all, kwargs={"equivalence_only": True}, num_proc=3, env=ENV))


def test_distributed_optimizer_behaves_as_horovods(two_rank_reports):
    for rank, report in enumerate(two_rank_reports):
        b = report["behaviour"]
        assert b["class"] == ("SGD", True, 0.1)
        assert b["started during backward"] == [1, 1, 1, 1], "every gradient's allreduce starts in backward()"
        assert b["zero_grad while pending"][0] == "AssertionError"
        assert "before optimizer.step() or optimizer.synchronize()" in b["zero_grad while pending"][1]
        assert b["step hooks"] == ["pre", "post"]
        assert b["zero_grad(set_to_none=False)"] and b["zero_grad()"]
        assert b["passes=2 handles after 1st/2nd backward"] == (0, 4)
        assert b["third backward"][0] == "AssertionError"
        assert "more than backward_passes_per_step times" in b["third backward"][1]
        assert b["after set_backward_passes_per_step(1)"] == 4
        assert b["set_backward_passes_per_step(0)"][:2] == (
            "ValueError", "backward_passes_per_step must be an integer >= 1, got 0")
        # Sum of the inputs 1 and 2 is 3 per weight; one SGD step with lr 1 from 0 gives -3.
        grads, weights, warned = b["step after synchronize"]
        assert grads == [[3.0, 3.0]] and weights == [[-3.0, -3.0]]
        assert len(warned) == 1 and warned[0].startswith("optimizer.step() called without optimizer.skip_synchronize()")
        assert "the gradients were already reduced and are not reduced again" in warned[0]
        assert b["skip_synchronize"] == ([[-6.0, -6.0]], 0)
        assert b["step after synchronize and an unscale in place"] == ([[-1.5, -1.5]], 1)
        for clear in ("optimizer", "model"):  # the gradient summed over the ranks: 5 + 0
            assert b[f"skipped step, then only rank 0 computes ({clear}.zero_grad)"] == ([[-5.0, -5.0]], [])
        # Steps of lr 1 and 0.5 on the summed gradient 3: -3 - 1.5.
        assert b["scheduler made before wrapping"] == ([[-4.5, -4.5]], 0.25, [])
        assert b["wrapped again"] == [[-10.5, -10.5]], "two more steps of lr 1 on the summed gradient 3"
        assert b["hooks with the wrapper, after it is dropped"] == (1, 0)
        held = (True, True) if rank == 0 else None
        assert b["dropped in flight"] == (1, held, False, True), "kept while in flight, then released and freed"
        assert b["unused everywhere"] == ([0.0, 0.0, 0.0], True), "zeros for the unused, the other rank's head reduced"
        assert b["load_state_dict"] == (True, True)
        assert b["trainable after wrapping"] == [
            "DistributedOptimizer: parameter of shape (16,) has a gradient that is not averaged across ranks: it was "
            "not trainable (requires_grad) or not in the optimizer when the DistributedOptimizer was made, so each "
            "rank trains it alone. Make the DistributedOptimizer again after changing which parameters train."]
        assert b["user hook after wrapping: wrong updates"] == 0
        is_sparse, difference = b["sparse gradient missing on rank 1"]
        assert is_sparse and difference <= 1e-7

        assert b["compression that raises on rank 1"][:2] == (
            "HoroInvalidArgument", "allreduce tensor 'allreduce.weight': rank 1 could not compress its tensor with "
            "compression Failing: ValueError: no room"), f"rank {rank}"

        errors = b["errors"]
        want = {
            "not tuples": ("ValueError", "named_parameters should be a sequence of tuples (name, parameter)"),
            "duplicates": ("ValueError", "Parameter names in named_parameters must be unique. Found duplicates: w"),
            "unnamed": ("ValueError", "one or more model parameters were not named: group 0 index 2 shape (4, 16)"),
            "predivide with Sum": ("ValueError", "gradient_predivide_factor not supported with op != Average"),
            "predivide <= 0": ("ValueError", "gradient_predivide_factor must be > 0, got 0.0"),
            "passes 0": ("ValueError", "backward_passes_per_step must be an integer >= 1, got 0"),
            "groups -1": ("ValueError", "groups should be a positive integer or a list of lists"),
            "groups of non-tensors": ("ValueError", "groups must consist of torch.Tensor, got str"),
            "parameter twice in groups": ("ValueError", "A parameter can only appear once in groups"),
            "unknown op": ("ValueError", "unknown op 42"),
            "frozen on rank 0 only": ("ValueError", "every rank must have the same trainable parameters (requires_grad)"
                                      "; against rank 0's 3: rank 1 also has ['fc1.bias']"),
        }
        want["frozen on rank 0 only, groups=1"] = want["frozen on rank 0 only"]
        for key, (kind, text) in want.items():
            got = errors[key]
            assert got is not None and got[0] == kind and text in got[1], f"rank {rank} {key}: {got}"


def _adasum_training(steps=3):
    """DistributedOptimizer(op=Adasum) over SGD with momentum and over Adam, against a replay: each
    rank's own optimizer step on its own gradient (allgathered here), combined with the Adasum tree."""
    import horo_torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    tiny = torch.finfo(torch.float64).tiny ** 0.5  # below it a coefficient stays 1, as in Horovod

    def adasum(vectors):
        v = [x.double().clone() for x in vectors]
        stride = 1
        while stride < len(v):
            for i in range(0, len(v) - stride, 2 * stride):
                a, b = v[i], v[i + stride]
                dot, aa, bb = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
                v[i] = (1 - dot / aa / 2 if aa >= tiny else 1) * a + (1 - dot / bb / 2 if bb >= tiny else 1) * b
            stride *= 2
        return v[0]

    differences = {}
    for name, make in (("sgd momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
                       ("adam", lambda ps: torch.optim.Adam(ps, lr=0.01))):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
        replicas = [[p.detach().clone().requires_grad_() for p in model.parameters()] for _ in range(size)]
        local = [make(ps) for ps in replicas]  # every rank's optimizer, replayed here
        opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                       op=hvd.Adasum)
        worst = 0.0
        for step in range(steps):
            x = torch.randn(5, 3, generator=torch.Generator().manual_seed(100 * step + rank)).double()
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            grads = [hvd.allgather(p.grad.detach().unsqueeze(0), name=f"adasum.{name}.{step}.{i}")
                     for i, p in enumerate(model.parameters())]
            starts = [p.detach().clone() for p in replicas[0]]
            opt.step()
            deltas = []
            for s in range(size):
                for p, g, start in zip(replicas[s], grads, starts):
                    with torch.no_grad():
                        p.copy_(start)
                    p.grad = g[s].clone()
                local[s].step()
                deltas.append([p.detach() - start for p, start in zip(replicas[s], starts)])
            for i, start in enumerate(starts):
                combined = start + adasum([deltas[s][i] for s in range(size)])
                for s in range(size):
                    with torch.no_grad():
                        replicas[s][i].copy_(combined)
            worst = max(worst, max(float((p.detach() - q.detach()).abs().max())
                                   for p, q in zip(model.parameters(), replicas[0])))
        differences[name] = worst

    # Horovod's Adasum optimizer API: synchronize() does nothing, skip_synchronize() is refused,
    # zero_grad() while gradients accumulate is refused, parameters off the CPU are refused.
    model = torch.nn.Linear(3, 1).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    opt.synchronize()
    behaviour = {"skip_synchronize": capture(lambda: opt.skip_synchronize().__enter__())}
    model(torch.ones(2, 3).double()).sum().backward()
    behaviour["zero_grad while accumulating"] = capture(opt.zero_grad)
    model(torch.ones(2, 3).double()).sum().backward()
    opt.step()
    opt.set_backward_passes_per_step(1)
    model(torch.ones(2, 3).double()).sum().backward()
    opt.step()
    behaviour["meta parameters"] = capture(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(torch.nn.Linear(2, 2).to("meta").parameters(), lr=0.1), op=hvd.Adasum))

    class Failing:  # a compression that raises on the last rank alone: every rank gets its error
        @staticmethod
        def compress(tensor):
            raise ValueError("no room")

    lone = torch.nn.Linear(2, 1, bias=False).double()
    failing = hvd.DistributedOptimizer(torch.optim.SGD(lone.parameters(), lr=0.1), op=hvd.Adasum,
                                       named_parameters=lone.named_parameters(),
                                       compression=Failing if rank == size - 1 else hvd.Compression.none)
    behaviour["compression that raises"] = capture(
        lambda: (lone(torch.ones(1, 2).double()).sum().backward(), failing.step()))
    hvd.shutdown()
    return differences, behaviour


@pytest.mark.parametrize("size", [2, 3])
def test_adasum_optimizer_combines_each_ranks_step(size):
    for rank, (differences, behaviour) in enumerate(horo_runner.run(_adasum_training, num_proc=size)):
        assert all(d < 1e-12 for d in differences.values()), f"rank {rank}: {differences}"
        assert behaviour["skip_synchronize"][:2] == (
            "AssertionError", "Skipping synchronization is not supported when using Adasum optimizer."), behaviour
        assert behaviour["zero_grad while accumulating"][0] == "AssertionError", behaviour
        assert behaviour["meta parameters"][0] == "HoroUnsupportedError", behaviour
        assert "host (CPU) tensors only" in behaviour["meta parameters"][1], behaviour
        assert behaviour["compression that raises"][:2] == (
            "HoroInvalidArgument", f"allreduce tensor 'allreduce.adasum.weight': rank {size - 1} could not compress "
            "its tensor with compression Failing: ValueError: no room"), behaviour
