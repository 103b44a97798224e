"""What horo_torch.DistributedDataParallel checks and adapts when it wraps a module: torch DDP's
single-device arguments, the inputs moved to that device, torch's SyncBatchNorm layers and torch's
default communication hooks, which would go through torch.distributed (not initialised under Horo);
the set's first rank, the identity node on the outputs that queues the end-of-backward callback,
and keeping the forward helpers out of torch.compile.
"""
import os

import torch

from horo_core.process_sets import ProcessSet
from horo_torch.comm_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook


def _check_devices(module, device_ids, output_device):
    """torch DDP's single-device form: device_ids=[d] (and output_device d) where d is the module's
    one device; CPU modules take None.

    Returns:
        The device inputs are moved to (device_ids[0]), or None.
    """
    devices = {p.device for p in module.parameters()}
    given = [] if device_ids is None else list(device_ids)
    if output_device is not None:
        given.append(output_device)
    checked = []
    for d in given:
        device = torch.device(f"cuda:{d}" if isinstance(d, int) else d)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if devices != {device}:
            raise ValueError(f"device_ids and output_device must be None or the one device the module is on; got "
                             f"device_ids={device_ids}, output_device={output_device} for a module on "
                             f"{sorted(str(x) for x in devices)}")
        checked.append(device)
    return checked[0] if device_ids else None


def _to_device(value, device):
    """value with every tensor in it (also inside lists, tuples and dicts) moved to device, as torch
    DDP moves a single-device module's inputs to device_ids[0]."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_to_device(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _to_device(v, device)) for k, v in value.items())
    return value


def _adopt_torch_sync_batch_norms(module, process_set):
    """module with every torch.nn.SyncBatchNorm replaced by horo_torch's over process_set (the module
    itself when it is one). torch's layer synchronises through torch.distributed, which Horo does not
    initialise; it would then normalise each rank's batch alone without a word."""
    from horo_torch.sync_batch_norm import SyncBatchNorm

    def adopt(layer):
        return SyncBatchNorm.convert_sync_batchnorm(layer, process_set)

    if isinstance(module, torch.nn.SyncBatchNorm):
        return adopt(module)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.SyncBatchNorm):
                setattr(parent, name, adopt(child))
    return module


def run_comm_hook(hook, state, bucket):
    """hook(state, bucket), with an error that says what to do where the hook called into
    torch.distributed, which Horo does not initialise (a user's hook calling torch's
    default_hooks.allreduce_hook, say: only a hook registered itself is replaced by Horo's)."""
    try:
        return hook(state, bucket)
    except Exception as exc:
        where = _torch_distributed_frame(exc.__traceback__)
        if where is None or torch.distributed.is_available() and torch.distributed.is_initialized():
            raise
        name = getattr(hook, "__qualname__", repr(hook))
        raise RuntimeError(f"the DDP communication hook {name} called torch.distributed ({where}), which Horo does "
                           f"not initialise ({type(exc).__name__}: {exc}); inside a hook, call horo_torch.comm_hooks' "
                           f"allreduce_hook, fp16_compress_hook or bf16_compress_hook instead of torch's "
                           f"default_hooks") from exc


def _torch_distributed_frame(tb):
    """"file:line" of the first frame of traceback tb in torch.distributed's code, or None."""
    marker = os.path.join("torch", "distributed", "")
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        at = filename.rfind(marker)
        if at >= 0:
            return f"{filename[at:]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return None


def _horo_hook_for(hook, state):
    """hook, or Horo's equivalent of one of torch's default DDP hooks, which would communicate
    through torch.distributed (not initialised under Horo).

    Raises:
        NotImplementedError: a torch hook that communicates and has no Horo equivalent.
        ValueError: a torch default hook with a torch process group as state.
    """
    module = getattr(hook, "__module__", None) or ""
    if not module.startswith("torch.distributed.algorithms.ddp_comm_hooks"):
        return hook
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    equivalents = {default_hooks.allreduce_hook: allreduce_hook, default_hooks.fp16_compress_hook: fp16_compress_hook,
                   default_hooks.bf16_compress_hook: bf16_compress_hook}
    name = getattr(hook, "__qualname__", repr(hook))
    if hook in equivalents:
        if state is not None and not isinstance(state, ProcessSet):
            raise ValueError(f"register_comm_hook({name}): state is a torch.distributed process group; with Horo "
                             "pass None (the wrapper's process set) or a horo_torch.ProcessSet")
        return equivalents[hook]
    if module.endswith(".debugging_hooks"):
        return hook  # noop_hook communicates nothing
    wrapper = name.split(".<locals>")[0]
    if wrapper in ("fp16_compress_wrapper", "bf16_compress_wrapper"):
        # The wrappers cast around the hook they wrap, which may be one of torch's own: wrap its
        # Horo equivalent instead.
        inner = dict(zip(hook.__code__.co_freevars, (cell.cell_contents for cell in hook.__closure__ or ())))
        wrapped = inner.get("hook")
        if wrapped is None:
            return hook
        replacement = _horo_hook_for(wrapped, state)
        return hook if replacement is wrapped else getattr(default_hooks, wrapper)(replacement)
    raise NotImplementedError(f"register_comm_hook: {module}.{name} communicates through torch.distributed, which "
                              "horo_torch.DistributedDataParallel does not use. Horo provides "
                              "horo_torch.comm_hooks.allreduce_hook, fp16_compress_hook and bf16_compress_hook "
                              "(PowerSGD, quantisation and local SGD hooks are not available)")


def root_rank(process_set):
    """Returns the global rank of the first member of process_set (0 for the global set)."""
    if process_set.process_set_id == 0 or not process_set.ranks:
        return 0
    return process_set.ranks[0]


class _Sink(torch.autograd.Function):
    """Identity on the wrapper's outputs; its backward queues the wrapper's end-of-backward callback.

    An output the loss does not use passes None back, not zeros (as torch's _DDPSink), so that
    parameters that feed only such outputs get no gradient: zeros would let weight decay and
    momentum move them, and would hide them from the unused-parameter check."""

    @staticmethod
    def forward(ctx, owner, *tensors):
        ctx.owner = owner
        ctx.set_materialize_grads(False)
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        owner = ctx.owner()
        if owner is not None:
            with owner._lock:
                owner._queue_finish()
        return (None, *grads)
