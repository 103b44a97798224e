"""How ``horo_torch.ddp.DistributedDataParallel`` hands gradients to its collectives and takes them back:
a bucket's gradients as one flat tensor, a sparse bucket's own allreduce, waiting for every bucket,
writing the reduced buckets into ``.grad``, and the errors of a backward that left some parameters
without a gradient or gave one a gradient too late."""
import torch

from horo_core import basics
from horo_torch import mpi_ops
from horo_torch.functions import sparse_allreduce_async


class SparseFuture:
    """wait() returns the reduced sparse gradient of a sparse bucket."""

    def __init__(self, wait):
        self.wait = wait


def on_the_wire(tensor):
    """tensor as Horo's collectives take it: a complex tensor as its real view (real and imaginary
    parts side by side, sharing its storage), as torch.distributed sends complex tensors; Sum and
    Average of the parts are those of the complex numbers."""
    if not tensor.is_complex():
        return tensor
    # A conjugated view (t.conj()) has no real view of its own; its storage is the same on every rank.
    return torch.view_as_real(tensor.conj() if tensor.is_conj() else tensor)


def as_complex(flat, like):
    """A real flat tensor (flat_gradients' real view, or what a hook made of it) as the complex
    numbers of parameters like `like`, in their precision: a new tensor, whatever its offset."""
    return torch.view_as_complex(flat.to(like.real.dtype).reshape(-1, 2).clone())


def flat_gradients(bucket):
    """The dense gradients of a bucket's parameters, end to end in one new flat tensor; complex
    gradients as their real view (on_the_wire), twice as many real numbers."""
    with torch.no_grad():
        return on_the_wire(torch.cat([dense_grad(p).reshape(-1) for p in bucket.params])).reshape(-1)


def launch_sparse(bucket, process_set):
    """Starts the average of a sparse bucket's one gradient over process_set; returns a SparseFuture."""
    (p,) = bucket.params
    grad = p.grad
    if grad is None:  # unused here: an empty sparse gradient keeps the ranks' collectives alike
        grad = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.long),
                                       torch.zeros((0,) + tuple(p.shape[1:]), dtype=p.dtype), p.shape,
                                       device=p.device)
    elif not grad.is_sparse:
        grad = grad.to_sparse(1)
    return SparseFuture(sparse_allreduce_async(grad, bucket.name, mpi_ops.Average, process_set))


def raise_if_late(late, param_names):
    """Raises RuntimeError naming the parameters (indices in late) whose gradient was accumulated
    again after their bucket had been reduced."""
    if late:
        names = ", ".join(param_names[i] for i in late[:10])
        raise RuntimeError(
            f"DistributedDataParallel: on rank {basics.rank()}, parameters [{names}] received gradient again in "
            "this backward pass after their bucket was reduced (a module run more than once under reentrant "
            "activation checkpointing, torch.utils.checkpoint(use_reentrant=True)); their gradients would be "
            "wrong. Use use_reentrant=False, or static_graph=True if every iteration runs the same modules.")


def raise_if_unused(missing, param_names):
    """Raises RuntimeError naming the parameters (indices in missing) that got no gradient, with
    find_unused_parameters=False."""
    if missing:
        names = ", ".join(param_names[i] for i in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise RuntimeError(
            f"DistributedDataParallel: on rank {basics.rank()}, parameters [{names}{more}] received no gradient "
            "in this backward pass. Pass find_unused_parameters=True to DistributedDataParallel if some "
            "parameters do not take part in computing the loss (and check that every forward output is "
            "used in the loss). Their buckets were reduced with zeros so that no rank waits for ever.")


def write_back(buckets, results, usage, grad_scale, bucket_scale):
    """Writes each bucket's reduced flat tensor into the gradients of its parameters.

    Args:
        buckets: the buckets (horo_torch.ddp_buckets.Bucket), in launch order.
        results: per bucket, what its communication hook's future returned: a flat tensor with the
            bucket's number of elements, or a sparse gradient for a sparse bucket.
        usage: None, or per parameter the number of ranks that used it (find_unused_parameters);
            parameters no rank used keep their gradient.
        grad_scale: the factor of a sparse gradient (join(divide_by_initial_world_size=False)).
        bucket_scale: the factor of a dense bucket: grad_scale under Horo's own reduction, 1.0 for a
            registered hook, which is left to divide as it sees fit (as torch does).
    Raises:
        ValueError: a hook returned something other than a tensor of the bucket's size.
    """
    with torch.no_grad():
        for bucket, flat in zip(buckets, results):
            if isinstance(flat, torch.Tensor) and flat.is_sparse:
                (i,), (p,) = bucket.indices, bucket.params
                if usage is None or int(usage[i]) != 0:
                    p.grad = flat * grad_scale if grad_scale != 1.0 else flat
                continue
            expected = sum(p.numel() for p in bucket.params)
            if (bucket.params[0].is_complex() and isinstance(flat, torch.Tensor) and not flat.is_complex()
                    and flat.numel() == 2 * expected):
                flat = as_complex(flat, bucket.params[0])  # flat_gradients' real view
            if not isinstance(flat, torch.Tensor) or flat.numel() != expected:
                got = flat.numel() if isinstance(flat, torch.Tensor) else type(flat).__name__
                raise ValueError(f"communication hook returned {got} for bucket {bucket.name}; "
                                 f"expected a tensor of {expected} elements")
            flat = flat.reshape(-1)
            offset = 0
            for i, p in zip(bucket.indices, bucket.params):
                chunk = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                if bucket_scale != 1.0:
                    chunk = chunk * bucket_scale
                if usage is not None and int(usage[i]) == 0:
                    continue  # no rank used it: leave its gradient untouched, as DDP does
                if p.grad is None or p.grad.is_sparse:
                    p.grad = chunk.to(device=p.device, dtype=p.dtype).clone()
                else:
                    p.grad.copy_(chunk)


def dense_grad(p):
    """p's gradient as a dense tensor (zeros when it has none)."""
    if p.grad is None:
        return torch.zeros_like(p)
    return p.grad.to_dense() if p.grad.is_sparse else p.grad


def wait_all(waitables):
    """Waits for every handle or future (so no buffer is freed in flight); raises the first error.

    Args:
        waitables: Horo handles (ints) or objects with ``wait()``; None entries are skipped.
    Returns:
        The results, in order.
    Raises:
        The first exception raised while waiting.
    """
    results, error = [], None
    for w in waitables:
        try:
            if w is None:
                results.append(None)
            elif isinstance(w, int):
                results.append(mpi_ops.synchronize(w))
            else:
                results.append(w.wait())
        except Exception as exc:  # noqa: BLE001 - re-raised below after the rest completed
            error = error or exc
            results.append(None)
    if error is not None:
        raise error
    return results
