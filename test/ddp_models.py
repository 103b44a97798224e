"""The models and the single-process reference that test_torch_ddp.py trains the DDP wrapper against:
every rank draws the same full batches from the same seeds and takes its own rows."""
import torch

BATCH = 4
TINY_BUCKETS_MB = 16 / 2 ** 20  # 16 bytes: one parameter per bucket


# Models ------------------------------------------------------------------------------------------

class Mlp(torch.nn.Module):
    """Registered in the order it runs: reverse registration order matches the backward order."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x, rank=None):
        return self.fc2(torch.tanh(self.fc1(x)))


class Reordered(torch.nn.Module):
    """Registers the head first, so reverse registration order is the opposite of the backward order."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 3)
        self.body = torch.nn.Linear(5, 8)

    def forward(self, x, rank=None):
        return self.head(torch.tanh(self.body(x)))


class Branchy(torch.nn.Module):
    """Rank r's rows go through branch r % 2; ``never`` takes part on no rank; ``rank0`` only on rank 0."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(5, 6)
        self.branches = torch.nn.ModuleList([torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)])
        self.rank0 = torch.nn.Linear(3, 3)
        self.never = torch.nn.Linear(3, 3)

    def forward(self, x, rank):
        y = self.branches[rank % 2](torch.relu(self.trunk(x)))
        return self.rank0(y) if rank == 0 else y


class Normed(torch.nn.Module):
    """An Mlp with a BatchNorm between its layers: buffers (running statistics) that forward changes."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x, rank=None):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


class TwoHeads(torch.nn.Module):
    """Two outputs; the losses below use the first only, so head_b gets no gradient."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(5, 6)
        self.head_a = torch.nn.Linear(6, 3)
        self.head_b = torch.nn.Linear(6, 3)

    def forward(self, x, rank=None):
        h = torch.tanh(self.trunk(x))
        return self.head_a(h), self.head_b(h)


class RunTwiceCheckpointed(torch.nn.Module):
    """fc3 runs twice, each time under reentrant checkpointing: its gradient is accumulated twice
    per backward, in two inner backward passes."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(5, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 3)

    def forward(self, x, rank=None):
        from torch.utils.checkpoint import checkpoint
        h = torch.tanh(self.fc2(torch.tanh(self.fc1(x))))
        return checkpoint(self.fc3, checkpoint(self.fc3, h, use_reentrant=True), use_reentrant=True)


class Rotary(torch.nn.Module):
    """A complex parameter and a complex buffer (as a rotary embedding's ``freqs_cis``)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 4).double()
        self.mix = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.complex128) / 4)
        angles = torch.arange(4, dtype=torch.float64)
        self.register_buffer("phase", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, x, rank=None):
        h = torch.tanh(self.fc1(x)).to(torch.complex128) * self.phase
        return (h @ self.mix).real


def batch(step, rows, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, 5, generator=g).to(dtype), torch.randn(rows, 3, generator=g).to(dtype)


def local_loss(model, x, y, rank):
    return torch.nn.functional.mse_loss(model(x, rank=rank), y)


def rows(t, rank):
    return t[rank * BATCH:(rank + 1) * BATCH]


def reference_step(ref, opt, step, size, dtype, routed, micro=1):
    """One optimizer step of the single process on the N*b batch (micro-batches accumulated)."""
    opt.zero_grad()
    for m in range(micro):
        x, y = batch(step * micro + m, size * BATCH, dtype)
        if routed:  # each rank's rows take that rank's route: the mean over ranks of the rank losses
            loss = sum(local_loss(ref, rows(x, r), rows(y, r), r) for r in range(size)) / size
        else:
            loss = torch.nn.functional.mse_loss(ref(x), y)
        loss.backward()
    opt.step()


def train_and_compare(hvd, c, what, model_cls, opt_fn, steps=3, hook=None, tol=1e-10, dtype=torch.float64,
                      find_unused=False, routed=False, micro=1, process_set=None, on_step=None, static_graph=False):
    """Trains the DDP wrapper and the reference side by side; checks the parameters after every step.

    Returns:
        The wrapper.
    """
    from horo_torch.ddp import DistributedDataParallel
    process_set = process_set or hvd.global_process_set
    size, rank = process_set.size(), process_set.rank()
    torch.manual_seed(0)
    ref = model_cls().to(dtype)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(model_cls().to(dtype), bucket_cap_mb=TINY_BUCKETS_MB,
                                  find_unused_parameters=find_unused, process_set=process_set,
                                  static_graph=static_graph)
    if type(hook).__name__ == "BuiltinCommHookType":
        ddp._register_builtin_comm_hook(hook)
    elif hook is not None:
        ddp.register_comm_hook(None, hook)
    ref_opt, opt = opt_fn(ref.parameters()), opt_fn(ddp.parameters())
    for step in range(steps):
        reference_step(ref, ref_opt, step, size, dtype, routed, micro)
        opt.zero_grad()
        for m in range(micro):
            x, y = batch(step * micro + m, size * BATCH, dtype)
            context = ddp.no_sync() if m < micro - 1 else _nothing()
            with context:
                local_loss(ddp, rows(x, rank), rows(y, rank), rank).backward()
        opt.step()
        if on_step is not None:
            on_step(step, ddp)
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            c.close(f"{what} step {step} {name}", p.detach(), q.detach(), tol)
    return ddp


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)
