"""State helpers: broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object,
and sparse_allreduce_async, on 3 ranks (odd, so Average divides by a number that is not a power
of two) with one process set {1, 2} that excludes rank 0.

Every rank starts from rank-dependent values, so a helper that does nothing fails; every expected
value is exact, except the training trajectory after broadcast_optimizer_state, which must equal
the single-process one to float32 round-off.
"""
import os
import re
import threading

import numpy as np
import pytest
import torch

import horo_runner

SIZE = 3
ENV = {"HORO_STALL_SHUTDOWN_TIME_SECONDS": "60", "HORO_PEER_TIMEOUT_SECONDS": "60"}
STEPS, SHARD = 5, 4
EXACT = 2e-5


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batch(step, rows):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(rows, 5, generator=g), torch.randint(0, 3, (rows,), generator=g)


def train_step(model, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def values(tensors):
    return [t.detach().clone() for t in tensors]


def state_of(opt):
    """The optimizer's state_dict with tensors cloned, for comparison in the parent."""
    sd = opt.state_dict()
    state = {pid: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for pid, s in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


def capture(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test compares type and text
        return type(exc).__name__, str(exc)
    return None


def check_parameters(hvd, rank):
    report = {}
    model = make_model(seed=rank)
    report["state_dict before"] = values(model.state_dict().values())
    hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    report["state_dict after"] = values(model.state_dict().values())

    model = make_model(seed=10 + rank)
    report["named before"] = values(model.parameters())
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)  # a generator, as users pass it
    report["named after"] = values(model.parameters())

    tensors = [torch.full((2, 3), float(rank)), torch.arange(4, dtype=torch.int64) * (rank + 1)]
    hvd.broadcast_parameters(tensors, root_rank=2)
    report["list after"] = values(tensors)

    report["not a tensor"] = capture(lambda: hvd.broadcast_parameters({"lr": 0.1}, root_rank=0))
    report["not iterable"] = capture(lambda: hvd.broadcast_parameters(5, root_rank=0))

    # What only some ranks pass wrong is an error on every rank, before anything is sent: a model
    # with a layer fewer (rank 2), a layer of another width (rank 1), a non-tensor (rank 0).
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3 if rank != 2 else 2)])
    if rank == 1:
        model[1] = torch.nn.Linear(4, 5)
    report["different models"] = capture(lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0))
    state = dict(model.state_dict(), extra=0.5) if rank == 0 else model.state_dict()
    report["one rank's non-tensor"] = capture(lambda: hvd.broadcast_parameters(state, root_rank=1))
    # A root_rank only rank 1 passes as a string: nothing is sent, so no broadcast is left in flight
    # on the others (the names are used again below). NumPy's integers count as the same root.
    root = "0" if rank == 1 else np.int64(0) if rank == 2 else 0
    report["one rank's root as a string"] = capture(lambda: hvd.broadcast_parameters(model.state_dict(), root))
    model = torch.nn.Linear(2, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # the ranks still agree afterwards
    report["agree afterwards"] = values(model.state_dict().values())
    return report


class ForwardingOptimizer(torch.optim.Optimizer):
    """Forwards to the optimizer it holds; state is a read-only property (as torch's
    PostLocalSGDOptimizer)."""

    def __init__(self, optim):  # noqa: D107 - torch.optim.Optimizer.__init__ is not called, as there
        self.optim = optim
        self.param_groups = optim.param_groups
        self.defaults = optim.defaults

    @property
    def state(self):
        return self.optim.state

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)
        self.param_groups = self.optim.param_groups

    def step(self, closure=None):
        return self.optim.step(closure)


class SgdLoadingInPlace(torch.optim.SGD):
    """load_state_dict keeps the optimizer's own state dict, updated in place."""

    def load_state_dict(self, state_dict):
        state = self.state
        super().load_state_dict(state_dict)
        loaded = self.state
        state.clear()
        state.update(loaded)
        self.state = state


def check_optimizer_state(hvd, rank):
    report = {}

    # A fresh Adam stays fresh: only the hyper-parameters travel, and training then follows the
    # single-process trajectory exactly (Horovod's zero-gradient step would advance Adam's counter).
    model = make_model(seed=rank)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1), betas=(0.9, 0.99 - 0.001 * rank))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    group = opt.param_groups[0]
    report["fresh adam"] = (len(opt.state), group["lr"], group["betas"], type(group["betas"]).__name__)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    reference = make_model(seed=0)
    reference_opt = torch.optim.Adam(reference.parameters(), lr=0.01, betas=(0.9, 0.99))
    for step in range(STEPS):
        x, y = batch(step, SHARD * SIZE)
        train_step(reference, reference_opt, x, y)
        train_step(model, opt, x[rank * SHARD:(rank + 1) * SHARD], y[rank * SHARD:(rank + 1) * SHARD])
    report["fresh adam trajectory"] = max((a - b).abs().max().item()
                                          for a, b in zip(model.parameters(), reference.parameters()))
    report["fresh adam step"] = opt.state_dict()["state"][0]["step"].item()

    # Adam with state that differs per rank (rank r took r+1 local steps): root 1's state wins.
    model = make_model(seed=rank)
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (rank + 1), amsgrad=rank == 1)
    for step in range(rank + 1):
        x, y = batch(100 + 10 * rank + step, 6)
        train_step(model, opt, x, y)
    hvd.broadcast_optimizer_state(opt, root_rank=1)
    report["trained adam"] = state_of(opt)

    # SGD momentum: the root has state, rank 2 none; wrapped in a DistributedOptimizer.
    model = make_model(seed=rank)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5 + 0.1 * rank),
                                   named_parameters=model.named_parameters())
    if rank != 2:
        opt.param_groups[0]["params"][0].grad = torch.full((8, 5), float(rank + 1))
        torch.optim.SGD.step(opt)  # a local step with this rank's own gradient, no reduction
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    report["sgd"] = state_of(opt)

    # The root has no state, the others have some: they end up with none.
    model = make_model(seed=rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    if rank != 0:
        x, y = batch(7, 6)
        train_step(model, opt, x, y)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    report["root without state"] = (len(opt.state), opt.param_groups[0]["lr"])

    # Root's hyper-parameters land in this rank's own param_groups, so schedulers made before
    # wrapping still set the rate the distributed optimizer uses: ReduceLROnPlateau writes into the
    # group dicts, StepLR patches step().
    model = make_model(seed=rank)
    base = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1))
    group = base.param_groups[0]
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(base, factor=0.5, patience=0)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    plateau.step(1.0)
    plateau.step(1.0)  # no better than the last: halves the rate
    report["plateau"] = (opt.param_groups[0] is group, base.param_groups is opt.param_groups, opt.param_groups[0]["lr"])
    model = make_model(seed=rank)
    base = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    step_lr = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    x, y = batch(9, SHARD)
    train_step(model, opt, x, y)
    step_lr.step()
    report["step lr"] = (opt.param_groups[0]["lr"], len(opt.state))
    # Broadcast through the optimizer a DistributedOptimizer wraps: the one that steps sees it too.
    model = make_model(seed=rank)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    if rank == 0:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        torch.optim.SGD.step(opt)  # a local step, no reduction: momentum buffers on the root only
    hvd.broadcast_optimizer_state(base, root_rank=0)
    report["through the wrapped optimizer"] = (opt.state is base.state, len(opt.state))
    # Optimizers whose state cannot be re-pointed, or that keep their own dict when loading.
    for kind, make in (("forwarding", lambda ps: ForwardingOptimizer(torch.optim.SGD(ps, lr=0.1, momentum=0.9))),
                       ("loading in place", lambda ps: SgdLoadingInPlace(ps, lr=0.1, momentum=0.9))):
        model = make_model(seed=rank)
        opt = make(model.parameters())
        if rank == 0:
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            opt.step()
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        report[f"state of an optimizer {kind}"] = len(opt.state)

    # SGD's momentum for a sparse embedding is a sparse tensor: it arrives as one.
    embedding = torch.nn.Embedding(6, 2, sparse=True)
    opt = torch.optim.SGD(embedding.parameters(), lr=0.1, momentum=0.9)
    embedding(torch.tensor([1, 3 + rank % 3])).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    buffer = opt.state[embedding.weight]["momentum_buffer"]
    report["sparse momentum"] = (buffer.layout == torch.sparse_coo, buffer.coalesce().indices().tolist(),
                                 buffer.to_dense().tolist())

    # Different parameter layouts fail on every rank, naming the odd rank.
    model = torch.nn.Linear(4, 3 if rank == 2 else 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    report["layout mismatch"] = capture(lambda: hvd.broadcast_optimizer_state(opt, root_rank=0))
    # So do different optimizer classes: root's Adam hyper-parameters would replace rank 1's SGD's,
    # whose step() then failed on rank 1 alone.
    model = torch.nn.Linear(4, 2)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if rank == 1 else torch.optim.Adam(
        model.parameters())
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    report["class mismatch"] = capture(lambda: hvd.broadcast_optimizer_state(opt, root_rank=0))
    report["class mismatch keeps momentum"] = "momentum" in opt.param_groups[0] if rank == 1 else None
    return report


def check_objects(hvd, rank, pair):
    report = {}
    offset = 1000 * rank

    def shifted(v):
        return v + offset

    obj = {"nested": [1, 2.5, None, ("t", b"\x00\xff")], "array": np.arange(6).reshape(2, 3) * (rank + 1),
           "function": shifted, "big": bytes(range(256)) * 4097}
    received = hvd.broadcast_object(obj if rank == 1 else None, root_rank=1)
    report["broadcast_object"] = (received["nested"], received["array"].tolist(), received["function"](1),
                                  len(received["big"]), received["big"][:3] == b"\x00\x01\x02")
    report["broadcast_object named"] = hvd.broadcast_object({"rank": rank}, root_rank=0, name="config")

    mine = [7, "text", {"k": list(range(3000))}][rank]
    report["allgather_object"] = hvd.allgather_object(mine)
    report["allgather_object named"] = hvd.allgather_object(rank * 1.5, name="floats")
    if rank in (1, 2):
        report["broadcast_object in {1, 2}"] = hvd.broadcast_object(f"from {rank}", root_rank=2, process_set=pair)
        report["allgather_object in {1, 2}"] = hvd.allgather_object(rank, process_set=pair)
    # An object that does not pickle, on one rank: every rank fails, and the unnamed calls after
    # it still pair up (the failing rank once sent nothing, so the others took its next call's bytes).
    for kind, call in (("broadcast_object", lambda: hvd.broadcast_object(
                            threading.Lock() if rank == 1 else None, root_rank=1)),
                       ("allgather_object", lambda: hvd.allgather_object(threading.Lock() if rank == 2 else rank))):
        try:
            call()
            report[f"{kind} of a lock"] = "no error"
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            report[f"{kind} of a lock"] = (type(e).__name__, str(e), type(e.__cause__).__name__)
    report["broadcast_object after a lock"] = hvd.broadcast_object(f"from {rank}", root_rank=1)
    report["allgather_object after a lock"] = hvd.allgather_object(rank)
    # Horovod's test_horovod_join_allgather: an unnamed allgather that fails on the ranks still
    # training (rank 0 joined first) must not shift the names of the unnamed object helpers after it.
    if rank == 0:
        hvd.join()
    else:
        try:
            hvd.allgather(torch.ones(2, 3))
            report["allgather beside a joined rank"] = "no error"
        except RuntimeError:
            report["allgather beside a joined rank"] = "error"
        hvd.join()
    report["allgather_object after a one-sided failure"] = hvd.allgather_object(rank)
    report["broadcast_object after a one-sided failure"] = hvd.broadcast_object(rank, root_rank=2)
    return report


def check_sparse(hvd, rank):
    report = {}
    dense = torch.zeros(5, 2)
    dense[rank] = torch.tensor([1.0, 2.0])
    dense[4] = float(rank + 1)
    sparse = dense.to_sparse()
    for op in ("Sum", "Average"):
        reduced = hvd.sparse_allreduce_async(sparse, f"sparse.{op}", getattr(hvd, op))()
        report[op] = (reduced.layout == torch.sparse_coo, reduced.to_dense().tolist())
    # Integers: the ranks' entries add up before the truncating division, as in a dense Average:
    # 3, 4 and 5 at one index average to 4, where dividing each first gave 1 + 1 + 1.
    integers = torch.sparse_coo_tensor([[1]], torch.tensor([3 + rank]), (4,))
    reduced = hvd.sparse_allreduce_async(integers, "sparse.int", hvd.Average)()
    report["integer Average"] = (reduced.dtype, reduced.to_dense().tolist())
    report["Max"] = capture(lambda: hvd.sparse_allreduce_async(sparse, "sparse.max", hvd.Max))
    report["dense input"] = capture(lambda: hvd.sparse_allreduce_async(dense, "sparse.dense", hvd.Sum))
    # Dense shapes that differ between ranks (an embedding of another size on rank 2): every rank
    # raises, where rank 2 got a result and the others torch's error on indices out of range.
    rows = 6 if rank == 2 else 5
    other = torch.sparse_coo_tensor([[rows - 1]], [[1.0, 1.0]], (rows, 2))
    report["shapes differ"] = capture(lambda: hvd.sparse_allreduce_async(other, "sparse.shapes", hvd.Sum)())
    report["after"] = hvd.sparse_allreduce_async(sparse, "sparse.after", hvd.Sum)().to_dense().tolist()
    return report


def run_all():
    import horo_torch as hvd
    torch.set_num_threads(1)
    pair = hvd.ProcessSet([1, 2])
    hvd.init(process_sets=[pair])
    rank = hvd.rank()
    report = {"parameters": check_parameters(hvd, rank), "optimizer": check_optimizer_state(hvd, rank),
              "objects": check_objects(hvd, rank, pair), "sparse": check_sparse(hvd, rank)}
    hvd.shutdown()
    return report


@pytest.fixture(scope="module")
def reports():
    return horo_runner.run(run_all, num_proc=SIZE, env=ENV)


def assert_tensors_equal(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and torch.equal(g, w), f"{what}[{i}]: {g} != {w}"


def assert_states_equal(got, want, what):
    assert got["param_groups"] == want["param_groups"], what
    assert sorted(got["state"]) == sorted(want["state"]), what
    for pid, entries in want["state"].items():
        assert sorted(got["state"][pid]) == sorted(entries), f"{what} param {pid}"
        for key, value in entries.items():
            mine = got["state"][pid][key]
            if torch.is_tensor(value):
                assert mine.dtype == value.dtype and torch.equal(mine, value), f"{what} param {pid} {key}"
            else:
                assert mine == value, f"{what} param {pid} {key}"


def test_broadcast_parameters(reports):
    root1, root0 = reports[1]["parameters"], reports[0]["parameters"]
    assert not torch.equal(reports[0]["parameters"]["state_dict before"][0], root1["state_dict before"][0])
    for rank, report in enumerate(reports):
        p = report["parameters"]
        assert_tensors_equal(p["state_dict after"], root1["state_dict before"], f"rank {rank} state_dict")
        assert_tensors_equal(p["named after"], root0["named before"], f"rank {rank} named_parameters")
        assert_tensors_equal(p["list after"], [torch.full((2, 3), 2.0), torch.arange(4, dtype=torch.int64) * 3],
                             f"rank {rank} list")
        assert p["not a tensor"] == ("ValueError", "broadcast_parameters: 'lr' is a float, not a tensor; send other "
                                                   "objects with broadcast_object")
        assert p["not iterable"] == ("ValueError", "broadcast_parameters: params must be a dict or a list of (name, "
                                                   "tensor) pairs, got int")
        assert p["different models"] == (
            "ValueError", "broadcast_parameters: every rank must pass the same names, shapes and dtypes: rank 1 has 6 "
            "tensors, root rank 0 6; at position 2 rank 1 has '1.bias' [5] float32 where the root has '1.bias' [4] "
            "float32; rank 2 has 4 tensors, root rank 0 6; at position 4 rank 2 has nothing where the root has "
            "'2.bias' [4] float32")
        assert p["one rank's non-tensor"] == (
            "ValueError", "broadcast_parameters: every rank must pass the same names, shapes and dtypes: rank 0: "
            "'extra' is a float, not a tensor; send other objects with broadcast_object")
        assert p["one rank's root as a string"] == (
            "ValueError", "broadcast_parameters: every rank must pass the same root_rank: rank 0 passed 0, rank 1 "
            "passed '0', rank 2 passed 0")
        assert_tensors_equal(p["agree afterwards"], reports[0]["parameters"]["agree afterwards"], f"rank {rank}")


def test_broadcast_optimizer_state(reports):
    for rank, report in enumerate(reports):
        o = report["optimizer"]
        assert o["fresh adam"] == (0, 0.01, (0.9, 0.99), "tuple"), "no state created, root's hyper-parameters"
        assert o["fresh adam trajectory"] <= EXACT, f"rank {rank}: {o['fresh adam trajectory']}"
        assert o["fresh adam step"] == float(STEPS)
        assert_states_equal(o["trained adam"], reports[1]["optimizer"]["trained adam"], f"rank {rank} adam")
        assert o["trained adam"]["state"][0]["step"].item() == 2.0
        assert o["trained adam"]["param_groups"][0]["amsgrad"] is True
        assert_states_equal(o["sgd"], reports[0]["optimizer"]["sgd"], f"rank {rank} sgd")
        assert torch.equal(o["sgd"]["state"][0]["momentum_buffer"], torch.full((8, 5), 1.0))
        assert o["sgd"]["param_groups"][0]["momentum"] == 0.5
        assert o["root without state"] == (0, 0.2)
        assert o["plateau"] == (True, True, 0.05), f"rank {rank}"
        assert o["step lr"] == (0.05, 4), f"rank {rank}"
        assert o["through the wrapped optimizer"] == (True, 4), f"rank {rank}"
        # Root's rows 1 and 3, each the gradient of a sum: ones.
        assert o["sparse momentum"] == (True, [[1, 3]], [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0],
                                                         [0.0, 0.0]]), f"rank {rank}: {o['sparse momentum']}"
        assert (o["state of an optimizer forwarding"], o["state of an optimizer loading in place"]) == (4, 4), \
            f"rank {rank}"
        kind, message = o["layout mismatch"]
        assert kind == "ValueError"
        assert message == ("broadcast_optimizer_state: the optimizer's parameter groups differ from root rank 0's "
                           "[[(2, 4), (2,)]]: rank 2 has parameter shapes [[(3, 4), (3,)]]")
        assert o["class mismatch"] == (
            "ValueError", "broadcast_optimizer_state: the optimizer is torch.optim.sgd.SGD on rank 1, "
            "torch.optim.adam.Adam on root rank 0"), f"rank {rank}"
        assert o["class mismatch keeps momentum"] is (True if rank == 1 else None)


def test_broadcast_and_allgather_objects(reports):
    for rank, report in enumerate(reports):
        o = report["objects"]
        assert o["broadcast_object"] == ([1, 2.5, None, ("t", b"\x00\xff")], [[0, 2, 4], [6, 8, 10]], 1001,
                                         256 * 4097, True)
        assert o["broadcast_object named"] == {"rank": 0}
        assert o["allgather_object"] == [7, "text", {"k": list(range(3000))}]
        assert o["allgather_object named"] == [0.0, 1.5, 3.0]
        if rank in (1, 2):
            assert o["broadcast_object in {1, 2}"] == "from 2"
            assert o["allgather_object in {1, 2}"] == [1, 2]
        else:
            assert "broadcast_object in {1, 2}" not in o
        lock = "TypeError: cannot pickle '_thread.lock' object"
        for kind, culprit in (("broadcast_object", 1), ("allgather_object", 2)):
            # The same error on every rank; on the culprit, raised from pickling's.
            kind_, message, cause = o[f"{kind} of a lock"]
            assert (kind_, cause) == ("HoroInvalidArgument", "TypeError" if rank == culprit else "NoneType")
            assert re.fullmatch(rf"{kind} '{kind}\.noname\.\d+': rank {culprit} could not serialise its "
                                rf"object \({re.escape(lock)}\)", message), message
        assert o["broadcast_object after a lock"] == "from 1"
        assert o["allgather_object after a lock"] == [0, 1, 2]
        assert o.get("allgather beside a joined rank", "error") == "error"
        assert o["allgather_object after a one-sided failure"] == [0, 1, 2]
        assert o["broadcast_object after a one-sided failure"] == 2


def _sets_that_do_not_fit():
    import horo_torch as hvd
    from mpi4py import MPI
    refusals, rank = [], int(os.environ["HORO_RANK"])
    for comm, listed in ((None, [hvd.ProcessSet([0, 1] if rank == 0 else [1])]),
                         (None, [hvd.ProcessSet(MPI.COMM_WORLD)]), (MPI.COMM_WORLD, None)):
        try:
            hvd.init(comm, process_sets=listed)
            refusals.append(None)
        except ValueError as e:
            refusals.append(str(e))
    second = hvd.ProcessSet([1])
    hvd.init(process_sets=[second])
    second_id, total = second.process_set_id, hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    hvd.shutdown()
    return refusals, second_id, total


def test_process_sets_that_differ_between_ranks_fail_every_rank():
    """Rank 0 listing [0, 1] (which stands for the global set) and rank 1 listing [1]: rank 0's
    init returned, rank 1's waited for a registration rank 0 never made, and rank 0's next
    collective waited for ever. Every rank's init now names what each rank listed, and so it does
    for sets built from MPI communicators in a job that MPI did not launch (under hororun each
    rank's MPI_COMM_WORLD is the rank alone), and for init(comm=MPI.COMM_WORLD), which made each
    rank a job of one. A later init() with sets that fit succeeds."""
    results = horo_runner.run(_sets_that_do_not_fit, num_proc=2, env=ENV)
    for refusals, second_id, total in results:
        assert refusals[0] == ("init: every rank must list the same process sets by their ranks, got rank 0 "
                               "[[0, 1]], rank 1 [[1]]"), refusals
        assert refusals[1].startswith("init: ranks 0, 1: process sets built from MPI communicators need ranks "
                                      "that MPI launched"), refusals
        assert "but hororun launched this job" in refusals[1], refusals
        assert refusals[2].startswith("init(comm=<MPI communicator>) needs ranks that MPI launched"), refusals
        assert "but hororun launched this job" in refusals[2], refusals
        assert second_id == 1 and total == 2.0


def test_sparse_allreduce(reports):
    rows = [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [6.0, 6.0]]
    for report in reports:
        s = report["sparse"]
        assert s["Sum"] == (True, rows)
        assert s["Average"] == (True, (torch.tensor(rows) / 3).tolist())
        assert s["integer Average"] == (torch.int64, [0, 4, 0, 0]), s["integer Average"]  # (3 + 4 + 5) / 3
        assert s["Max"][0] == "ValueError" and "only be reduced with Average or Sum" in s["Max"][1]
        assert s["dense input"][0] == "ValueError" and "want a sparse COO tensor" in s["dense input"][1]
        assert s["shapes differ"] == (
            "ValueError", "sparse_allreduce_async('sparse.shapes'): every rank must pass the same dense shape: "
                          "rank 0 has [5], rank 1 has [5], rank 2 has [6]")
        assert s["after"] == rows


def _coinciding_sets():
    import horo_torch as hvd
    everyone, second, again = hvd.ProcessSet([0, 1]), hvd.ProcessSet([1]), hvd.ProcessSet([1])
    hvd.init(process_sets=[everyone, second, again, hvd.global_process_set])
    ids = [everyone.process_set_id, second.process_set_id, again.process_set_id, hvd.global_process_set.process_set_id]
    alone = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again).item() if hvd.rank() == 1 else None
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=everyone).item()  # after rank 1's own
    hvd.shutdown()
    return ids, total, alone, again.process_set_id


def test_listed_sets_that_coincide_stand_for_one_set():
    """hvd.init(process_sets=[...]) with a set of every rank, a set listed twice and the global set
    itself: init goes on (as Horovod's), and each such set stands for the one with its ranks."""
    results = horo_runner.run(_coinciding_sets, num_proc=2, env=ENV)
    for rank, (ids, total, alone, after) in enumerate(results):
        assert ids[0] == ids[3] == 0 and ids[1] == ids[2] and ids[1] not in (None, 0), ids
        assert total == 2.0 and alone == (1.0 if rank == 1 else None) and after is None

