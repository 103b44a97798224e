"""DistributedOptimizer(op=Adasum): Horovod's "delta" optimizer for Adasum.

Adasum combines what each rank's optimizer would do, not the raw gradients: when a parameter's
gradient is ready (after ``backward_passes_per_step`` passes), the wrapped optimizer steps on that
parameter alone, its change from the value before (the delta) is allreduced with Adasum, and
``step()`` sets each parameter to its value before plus the combined delta. The optimizer's own
state (momentum, Adam's moments) thus stays local to each rank, as in Horovod.
"""
import weakref

import torch

from horo_torch._weak_hooks import remove_when_collected, weak_hook
from horo_torch.mpi_ops import Adasum, abandon, allreduce_async_, synchronize

_GRADIENTS_COMPUTED_TOO_OFTEN = ("Gradients were computed more than backward_passes_per_step times before call to "
                                 "step(). Increase backward_passes_per_step to accumulate gradients locally.")


class _DistributedAdasumOptimizer:
    """Methods mixed in front of the wrapped optimizer's class; see the module docstring."""

    _horo_scheduled = None

    def _horo_adasum_setup(self, parameter_names, compression, backward_passes_per_step, process_set,
                           zero_grad_pending_message):
        self._parameter_names = parameter_names
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = Adasum
        self.process_set = process_set
        self._zero_grad_pending = zero_grad_pending_message
        self._requires_update = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._allreduce_delay = {p: backward_passes_per_step for p in self._requires_update}
        self._starts = {}   # parameter -> its value before this step's local update
        self._handles = {}  # parameter -> (handle, compression context) of its delta's Adasum
        self._hook_handles = [p.register_post_accumulate_grad_hook(weak_hook(self, "_gradient_ready", p))
                              for p in self._requires_update]
        remove_when_collected(self, self._hook_handles)
        weakref.finalize(self, _abandon_all, self._handles)

    def _gradient_ready(self, p):
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(_GRADIENTS_COMPUTED_TOO_OFTEN)
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            self._handles[p] = self._submit_delta(p)

    def _submit_delta(self, p):
        start = self._starts.get(p)
        if start is None:
            start = self._starts[p] = torch.empty_like(p, requires_grad=False)
        with torch.no_grad():
            start.copy_(p)
        stashed = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:  # the wrapped optimizer steps on p alone
                group["params"] = [p] if any(q is p for q in group["params"]) else []
            super().step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)  # p holds its delta until step() sets it
        compressed, context = self._compression.compress(p.detach())
        handle = allreduce_async_(compressed, name=f"adasum.{self._parameter_names[p]}", op=Adasum,
                                  process_set=self.process_set)
        return handle, context, compressed

    def step(self, closure=None):
        """Completes every parameter's Adasum of its delta and applies the combined deltas.

        Args:
            closure: called first, as the wrapped optimizer would (its loss is returned).
        Returns:
            The closure's loss, or None.
        """
        loss = closure() if closure is not None else None
        for p in self._requires_update:  # parameters whose gradient was not ready: their delta now
            if p not in self._handles:
                self._handles[p] = self._submit_delta(p)
        try:
            for p, (handle, context, _) in self._handles.items():
                delta = self._compression.decompress(synchronize(handle), context)
                with torch.no_grad():
                    p.copy_(self._starts[p] + delta.to(p.dtype))
        finally:
            self._handles.clear()
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
        original = self._horo_scheduled() if self._horo_scheduled else None
        if original is not None:
            original._opt_called = True
        return loss

    def zero_grad(self, set_to_none=True):
        """Clears the gradients, as the wrapped optimizer does.

        Raises:
            AssertionError: deltas are being combined (call step() first).
        """
        if self._handles:
            raise AssertionError(self._zero_grad_pending)
        return super().zero_grad(set_to_none=set_to_none)


def _abandon_all(handles):
    abandon([handle for handle, _, _ in handles.values()])
