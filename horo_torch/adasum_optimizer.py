"""DistributedOptimizer(op=Adasum): Horovod's "delta" optimizer for Adasum.

As in Horovod, the wrapped optimizer's step (and any step hooks registered on it) runs once per
parameter, during backward, on that parameter alone.

Adasum combines what each rank's optimizer would do, not the raw gradients: when a parameter's
gradient is ready (after ``backward_passes_per_step`` passes), the wrapped optimizer steps on that
parameter alone, its change from the value before (the delta) is allreduced with Adasum, and
``step()`` sets each parameter to its value before plus the combined delta. The optimizer's own
state (momentum, Adam's moments) thus stays local to each rank, as in Horovod.
"""
import contextlib
import weakref

import torch

from horo_core._binding import lib
from horo_core.errors import HoroUnsupportedError
from horo_torch._calls import _compressed
from horo_torch._weak_hooks import hook_gradients_ready
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
        devices = sorted({str(p.device) for p in self._requires_update if p.device.type != "cpu"})
        if devices:
            raise HoroUnsupportedError(f"DistributedOptimizer(op=Adasum): parameters on {devices}; Adasum is "
                                       "supported for host (CPU) tensors only")
        self._allreduce_delay = {p: backward_passes_per_step for p in self._requires_update}
        self._starts = {}   # parameter -> its value before this step's local update
        self._handles = {}  # parameter -> (handle, compression context) of its delta's Adasum
        self._accumulators = hook_gradients_ready(self, self._requires_update, "_gradient_ready")
        weakref.finalize(self, _abandon_all, self._handles)

    def _accumulating(self):
        return any(0 < delay < self.backward_passes_per_step for delay in self._allreduce_delay.values())

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
        name = f"adasum.{self._parameter_names[p]}"
        # A compression that fails on this rank fails the delta's Adasum on every rank.
        (compressed, context), = _compressed(self._compression, lib.HORO_ALLREDUCE, "allreduce", name, [p.detach()],
                                             self.process_set)
        handle = allreduce_async_(compressed, name=name, op=Adasum, process_set=self.process_set)
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
        pending = list(self._handles.items())
        self._handles.clear()
        done = 0
        try:
            for done, (p, (handle, context, _)) in enumerate(pending):
                delta = self._compression.decompress(synchronize(handle), context)
                with torch.no_grad():
                    p.copy_(self._starts[p] + delta.to(p.dtype))
        except BaseException:
            # Parameters whose combined delta did not arrive go back to their value before the step.
            abandon([handle for _, (handle, _, _) in pending[done + 1:]])
            with torch.no_grad():
                for p, _ in pending[done:]:
                    p.copy_(self._starts[p])
            raise
        finally:
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
        original = self._horo_scheduled() if self._horo_scheduled else None
        if original is not None:
            original._opt_called = True
        return loss

    def zero_grad(self, set_to_none=True):
        """Clears the gradients, as the wrapped optimizer does.

        Raises:
            AssertionError: deltas are being combined, or gradients accumulated (call step() first).
        """
        if self._handles or self._accumulating():
            raise AssertionError(self._zero_grad_pending)
        return super().zero_grad(set_to_none=set_to_none)

    def synchronize(self):
        """Does nothing, as in Horovod's Adasum optimizer: the deltas are combined in step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Not available with Adasum (as in Horovod): step() must combine the deltas.

        Raises:
            AssertionError: always.
        """
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover

    def set_backward_passes_per_step(self, passes):
        """Changes how many backward passes accumulate locally before each delta is combined.

        Raises:
            ValueError: passes is not a positive integer.
        """
        from horo_torch.optimizer import _check_backward_passes  # that module imports this one
        self.backward_passes_per_step = _check_backward_passes(passes)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def load_state_dict(self, state_dict):
        """Loads the wrapped optimizer's state (after combining any delta in flight), keeping an LR
        scheduler made on the optimizer before wrapping attached.

        Args:
            state_dict: as for the wrapped optimizer.
        """
        if self._handles:
            self.step()
        result = super().load_state_dict(state_dict)
        original = self._horo_scheduled() if self._horo_scheduled else None
        if original is not None:
            original.param_groups, original.state = self.param_groups, self.state
        return result


def _abandon_all(handles):
    abandon([handle for handle, _, _ in handles.values()])
