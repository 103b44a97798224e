"""``SyncBatchNorm``: batch normalisation whose statistics cover the batches of all ranks.

Forward, in training (or whenever running statistics are not tracked): every rank computes the
count, mean and sum of squared deviations (M2) of each channel over its local batch; one allgather
brings every rank's triple to every rank, and they are combined with Chan's parallel formula
(mean = sum(n_r * mean_r) / n, M2 = sum(M2_r + n_r * (mean_r - mean)^2)), in float64 so that
ranks with very different batches lose no precision. The input is normalised with the global mean
and biased variance; the running statistics are updated like ``torch.nn.BatchNorm`` does, with the
unbiased global variance.

Backward: with x_hat the normalised input and g the output gradient, the input gradient of batch
normalisation needs the sums over the whole batch of g and of g * x_hat. Each rank computes its
local sums and one allreduce (Sum) gives the global ones:

    grad_x = weight * invstd * (g - sum(g) / n - x_hat * sum(g * x_hat) / n)

The weight and bias gradients stay local (sum(g * x_hat) and sum(g) over this rank's batch), as
with torch's SyncBatchNorm: the data-parallel wrapper or optimizer averages them with the other
parameter gradients.

Every rank must run the same SyncBatchNorm layers in the same order, forward and backward.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from horo_core.process_sets import global_process_set
from horo_torch import mpi_ops
from horo_torch._compile import eager_under_compile


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


def _channel_shape(x):
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def global_batch_stats(x, process_set):
    """Returns the mean, biased variance and element count per channel over every rank's batch.

    Args:
        x: the local input, shape (N, C, ...); N may differ per rank and may be 0.
        process_set: the ranks whose batches are combined.
    Returns:
        (mean, var, count): float64 tensors of shape (C,), and the global count as an int.
    """
    with torch.no_grad():
        channels = x.shape[1]
        local = x.detach().double()
        count = x.numel() // channels if channels else 0
        if count:
            mean = local.mean(_reduce_dims(x))
            m2 = ((local - mean.view(_channel_shape(x))) ** 2).sum(_reduce_dims(x))
        else:
            mean = torch.zeros(channels, dtype=torch.float64, device=x.device)
            m2 = torch.zeros_like(mean)
        packed = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device), mean, m2])
        if process_set.size() > 1:
            # Named, as Horovod's are, so that the user's unnamed collectives cannot shift these
            # (an auto name counts calls); by the channel count, so that layers alike share one.
            packed = mpi_ops.allgather(packed.unsqueeze(0), name=f"sync_batch_norm.stats.{channels}",
                                       process_set=process_set)
        else:
            packed = packed.unsqueeze(0)
        counts, means, m2s = packed[:, :1], packed[:, 1:1 + channels], packed[:, 1 + channels:]
        total = float(counts.sum())
        if total == 0:
            return means.sum(0), m2s.sum(0), 0
        mean = (counts * means).sum(0) / total
        m2 = (m2s + counts * (means - mean) ** 2).sum(0)
        return mean, m2 / total, int(round(total))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Normalises with given global statistics; backward reduces the statistics' gradient terms."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, count, process_set):
        shape = _channel_shape(x)
        x_hat = (x - mean.view(shape)) * invstd.view(shape)
        out = x_hat
        if weight is not None:
            out = out * weight.view(shape) + bias.view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count, ctx.process_set, ctx.has_bias = count, process_set, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, mean, invstd = ctx.saved_tensors
        shape, dims = _channel_shape(x), _reduce_dims(x)
        x_hat = (x - mean.view(shape)) * invstd.view(shape)
        sum_dy = grad_out.sum(dims)
        sum_dy_xhat = (grad_out * x_hat).sum(dims)
        channels = x.shape[1]
        # Every rank reduces, whatever it needs, so that the collectives match across ranks.
        packed = torch.cat([sum_dy, sum_dy_xhat])
        if ctx.process_set.size() > 1:
            packed = mpi_ops.allreduce(packed, op=mpi_ops.Sum, name=f"sync_batch_norm.grads.{channels}",
                                       process_set=ctx.process_set)
        global_dy, global_dy_xhat = packed[:channels], packed[channels:]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            scale = invstd if weight is None else invstd * weight
            grad_x = (grad_out - (global_dy / ctx.count).view(shape)
                      - x_hat * (global_dy_xhat / ctx.count).view(shape)) * scale.view(shape)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = sum_dy
        return grad_x, grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over the union of the batches of every rank of a process set.

    Works on CPU and CUDA tensors of any floating dtype (statistics are computed in float64, the
    output has the input's dtype). In eval mode with running statistics it is a local BatchNorm.

    Args:
        num_features: C, the number of channels of an input of shape (N, C, ...).
        eps: added to the variance for numerical stability.
        momentum: weight of the new batch in the running statistics; None for a cumulative average.
        affine: learn a per-channel weight and bias.
        track_running_stats: keep running mean and variance (used in eval mode).
        process_set: the ranks whose batches are normalised together.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_set = process_set

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x):
        """Normalises x with statistics over every rank's batch (training) or the running ones (eval).

        Args:
            x: tensor of shape (N, C, ...).
        Returns:
            Tensor of x's shape and dtype.
        Raises:
            ValueError: x has fewer than 2 dimensions, C differs from num_features, or the
                global batch has a single value per channel in training.
        """
        self._check_input_dim(x)
        if x.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels, got input of shape {tuple(x.shape)}")
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return self._normalise_globally(x)

    @eager_under_compile
    def _normalise_globally(self, x):
        mean, var, count = global_batch_stats(x, self.process_set)
        if count <= 1 and self.training:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {tuple(x.shape)} "
                             f"and {count} value(s) per channel over all ranks")
        if self.training and self.track_running_stats:
            self._update_running_stats(mean, var, count)
        compute = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        invstd = torch.rsqrt(var + self.eps)
        weight = None if self.weight is None else self.weight.to(compute)
        bias = None if self.bias is None else self.bias.to(compute)
        out = _SyncBatchNormFunction.apply(x.to(compute), weight, bias, mean.to(compute), invstd.to(compute),
                                           count, self.process_set)
        return out.to(x.dtype)

    def _update_running_stats(self, mean, var, count):
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            unbiased = var * (count / (count - 1))
            self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
            self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=global_process_set):
        """Returns module with every BatchNorm*D layer replaced by a SyncBatchNorm (torch's helper).

        Weights, biases, running statistics, ``training`` and ``requires_grad`` are carried over.

        Args:
            module: a module, or a BatchNorm layer itself.
            process_set: the ranks the new layers synchronise over.
        Returns:
            The converted module (module itself, modified in place, unless module is a BatchNorm).
        """
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set=process_set)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return converted
