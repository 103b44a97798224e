"""DistributedOptimizer: reduces gradients across ranks while the backward pass still runs.

A hook on every trainable parameter fires once autograd has accumulated that parameter's gradient
(``register_post_accumulate_grad_hook``, or the gradient accumulator's hook before torch 2.1) and
starts the allreduce of that gradient at once, so communication overlaps the rest of the backward
pass. With ``backward_passes_per_step=n`` the allreduce starts on the n-th accumulation. With
``groups``, a group's allreduce starts when its last gradient is ready, as one fused operation.

``step()`` first calls ``synchronize()``: it submits what the hooks did not (gradients this rank
never computed, as zeros; groups still missing a gradient; partial accumulations), so every rank
submits the same set of reductions and none waits forever; it then waits for all of them, writes
the results into ``p.grad`` and finally runs the wrapped optimizer's own ``step``.
"""
import collections
import contextlib
import warnings
import weakref

import torch

from horo_core._binding import lib
from horo_core.process_sets import global_process_set
from horo_torch._calls import _compressed
from horo_torch._compile import eager_under_compile
from horo_torch._weak_hooks import hook_gradients_ready
from horo_torch.adasum_optimizer import _DistributedAdasumOptimizer
from horo_torch.compression import Compression
from horo_torch.functions import _gather_if_different, sparse_allreduce_async
from horo_torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, abandon, allreduce_async_,
                                grouped_allreduce_async_, synchronize)

_OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product", Adasum: "Adasum"}

_ZERO_GRAD_PENDING = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                      "optimizer.synchronize(). This is prohibited as it can cause a race condition.")
_STEP_AFTER_SYNCHRONIZE = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                           "optimizer.synchronize(); the gradients were already reduced and are not reduced again. "
                           "Use optimizer.skip_synchronize() when you call optimizer.synchronize() yourself.")


class _Submitted:
    """One reduction in flight: the handle, the parameters it covers and how to undo compression."""

    __slots__ = ("handle", "params", "contexts", "sparse")

    def __init__(self, handle, params, contexts, sparse):
        self.handle, self.params, self.contexts, self.sparse = handle, params, contexts, sparse


def _abandon_in_flight(submitted_by_unit):
    """Hands the reductions a collected optimizer left in flight to mpi_ops.abandon."""
    handles = []
    for submitted in submitted_by_unit.values():
        handles.extend(submitted.handle.handles if submitted.sparse else [submitted.handle])
    abandon(handles)


def _split_evenly(items, parts):
    """items cut into `parts` consecutive, non-empty runs whose lengths differ by at most one."""
    count, extra = divmod(len(items), parts)
    runs, start = [], 0
    for i in range(parts):
        end = start + count + (1 if i < extra else 0)
        if end > start:
            runs.append(items[start:end])
        start = end
    return runs


def _check_same_parameters(everyones, members):
    """Raises on every rank where the ranks' trainable parameters (everyones: each member's names)
    differ: a parameter that only some ranks reduce would leave the others waiting for ever."""
    first = set(everyones[0])
    problems = []
    for rank, names in zip(members[1:], everyones[1:]):
        lacks, extra = sorted(first - set(names)), sorted(set(names) - first)
        if lacks or extra:
            problems.append(f"rank {rank} " + " and ".join(
                text for text in (f"lacks {lacks}" if lacks else "", f"also has {extra}" if extra else "") if text))
    if problems:
        raise ValueError("DistributedOptimizer: every rank must have the same trainable parameters (requires_grad); "
                         f"against rank {members[0]}'s {len(first)}: " + "; ".join(problems))


class _DistributedOptimizer:
    """Methods mixed in front of the wrapped optimizer's class; see DistributedOptimizer."""

    _horo_scheduled = None  # weak reference to the wrapped optimizer when an LR scheduler had patched it

    def _horo_setup(self, parameter_names, compression, backward_passes_per_step, op, gradient_predivide_factor,
                    groups, sparse_as_dense, process_set):
        self._parameter_names = parameter_names
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._groups = groups
        self._requires_update = []        # trainable parameters, in reduction order
        self._units = []                  # what one reduction covers: a tuple of parameters
        self._unit_of = {}                # parameter -> index into _units
        self._allreduce_delay = {}        # parameter -> backward passes left before its reduction
        self._ready_in_unit = []          # per unit: parameters whose gradient is complete this step
        self._handles = {}                # unit index -> _Submitted
        self._sparse_dims = {}            # parameter -> sparse_dim of its last sparse gradient
        self._accumulators = []           # the gradient accumulator nodes that carry the hooks
        self._synchronized = None         # after synchronize(): the reduced gradients, see _unchanged_since
        self._should_synchronize = True
        self._unreduced_warned = {}       # id -> weak reference of each parameter _warn_of_unreduced named
        self._reduces = process_set.included() and process_set.size() > 1
        if self._reduces:
            self._register_hooks()

    # Hooks ---------------------------------------------------------------------------------------

    def _register_hooks(self):
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        names = [self._parameter_names[p] for p in params]
        everyones = _gather_if_different(names, "DistributedOptimizer.parameters", self.process_set)
        if everyones is not None:
            _check_same_parameters(everyones, self.process_set._members())
        if self._groups is not None:
            if everyones is not None:  # the same parameters in other orders: every rank groups in the first's
                by_name = {self._parameter_names[p]: p for p in params}
                params = [by_name[n] for n in everyones[0]]
            units = self._form_groups(params)
        else:
            units = [(p,) for p in params]
        self._requires_update = params
        self._units = units
        self._unit_of = {p: i for i, unit in enumerate(units) for p in unit}
        self._ready_in_unit = [0] * len(units)
        self._allreduce_delay = {p: self.backward_passes_per_step for p in params}
        self._accumulators = hook_gradients_ready(self, params, "_gradient_ready")
        # Dropped between backward() and step(), it leaves reductions in flight: their handles are let go.
        weakref.finalize(self, _abandon_in_flight, self._handles)

    def _form_groups(self, params):
        if isinstance(self._groups, int):
            return [tuple(run) for run in _split_evenly(params, self._groups)]
        trainable = {id(p) for p in params}
        units, grouped = [], set()
        for group in self._groups:
            members = tuple(p for p in group if id(p) in trainable)
            if members:
                units.append(members)
                grouped.update(id(p) for p in members)
        units.extend((p,) for p in params if id(p) not in grouped)
        return units

    def _gradient_ready(self, p):
        if self._allreduce_delay[p] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call to "
                                 "step(). Increase backward_passes_per_step to accumulate gradients locally.")
        if p.grad.requires_grad:
            raise RuntimeError(f"DistributedOptimizer: the gradient of '{self._parameter_names[p]}' requires grad "
                               "(backward with create_graph=True), which gradient reduction does not support")
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] > 0:
            return
        index = self._unit_of[p]
        self._ready_in_unit[index] += 1
        if self._ready_in_unit[index] == len(self._units[index]):
            self._handles[index] = self._submit(self._units[index])

    # Reduction -----------------------------------------------------------------------------------

    def _scale_factors(self):
        if self.op == Average:  # the core divides by the set size after the postscale
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _submit(self, unit):
        """Starts the reduction of the gradients of one unit (a parameter or a group)."""
        names = [self._parameter_names[p] for p in unit]
        grads = [p.grad for p in unit]
        for p, g in zip(unit, grads):
            if g.is_sparse:
                self._sparse_dims[p] = g.sparse_dim()
        if len(unit) == 1 and grads[0].is_sparse and not self.sparse_as_dense:
            return _Submitted(sparse_allreduce_async(grads[0], names[0], self.op, self.process_set), unit, None, True)
        if any(g.is_sparse for g in grads) and not self.sparse_as_dense:
            sparse = [n for n, g in zip(names, grads) if g.is_sparse]
            raise ValueError(f"DistributedOptimizer: groups cannot hold parameters with sparse gradients ({sparse}); "
                             "leave them out of groups or pass sparse_as_dense=True")
        # A compression that fails on this rank fails these gradients' reduction on every rank.
        kind = "allreduce" if len(unit) == 1 else "grouped_allreduce"
        pairs = _compressed(self._compression, lib.HORO_ALLREDUCE, kind, names[0],
                            [g.to_dense() if g.is_sparse else g for g in grads], self.process_set)
        tensors = [t for t, _ in pairs]
        prescale, postscale = self._scale_factors()
        if len(unit) == 1:
            handle = allreduce_async_(tensors[0], name=names[0], op=self.op, prescale_factor=prescale,
                                      postscale_factor=postscale, process_set=self.process_set)
        else:
            handle = grouped_allreduce_async_(tensors, name=names[0], op=self.op, prescale_factor=prescale,
                                              postscale_factor=postscale, process_set=self.process_set)
        return _Submitted(handle, unit, pairs, False)

    def _install(self, submitted):
        """Waits for one reduction and writes its result into the gradients of its parameters."""
        if submitted.sparse:
            (p,) = submitted.params
            p.grad = submitted.handle()
            return
        outputs = synchronize(submitted.handle)
        if len(submitted.params) == 1:
            outputs = [outputs]
        for p, output, (_, context) in zip(submitted.params, outputs, submitted.contexts):
            reduced = self._compression.decompress(output, context)
            if p.grad.is_sparse:
                p.grad = reduced.to_sparse()
            elif reduced is not p.grad:
                p.grad.copy_(reduced)

    def _reset_step_state(self):
        self._handles.clear()
        self._ready_in_unit = [0] * len(self._units)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _drain(self):
        """Waits for every reduction in flight (keeping the first error) and resets the step."""
        error = None
        for submitted in self._handles.values():
            try:
                self._install(submitted)
            except Exception as exc:  # keep waiting so that no gradient is written after we return
                error = error or exc
        self._reset_step_state()
        if error is not None:
            raise error

    def _accumulating(self):
        return any(delay != self.backward_passes_per_step for delay in self._allreduce_delay.values())

    def _zero_gradient(self, p):
        """A zero gradient for a parameter this rank computed none for: an empty sparse tensor when the
        parameter's gradients were sparse before (so it takes the same path as on the other ranks)."""
        if p not in self._sparse_dims:
            return torch.zeros_like(p)
        sparse_dim = self._sparse_dims[p]
        indices = torch.empty((sparse_dim, 0), dtype=torch.int64, device=p.device)
        values = torch.empty((0, *p.shape[sparse_dim:]), dtype=p.dtype, device=p.device)
        return torch.sparse_coo_tensor(indices, values, p.shape)

    @eager_under_compile
    def synchronize(self):
        """Finishes the reduction of every gradient; afterwards ``p.grad`` holds the reduced values.

        Gradients this rank did not compute are reduced as zeros, so that every rank submits the
        same reductions. For a parameter with sparse gradients these zeros are an empty sparse tensor
        once this rank has seen one of its sparse gradients; in the very first step every rank must
        compute its gradient, or sparse_as_dense=True must be used.

        Returns:
            None.
        Raises:
            HorovodInternalError: a reduction failed (for example shapes differ between ranks).
        """
        if self._reduces:
            self._warn_of_unreduced()
        if not self._units:
            self._synchronized = self._gradients_now()
            return
        for index, unit in enumerate(self._units):
            if index in self._handles:
                continue
            for p in unit:
                if p.grad is None:
                    p.grad = self._zero_gradient(p)
            self._handles[index] = self._submit(unit)
        self._drain()
        self._synchronized = self._gradients_now()

    def _warn_of_unreduced(self):
        """Warns, once per parameter, of a gradient that no reduction covers: its parameter was made
        trainable, or added to the optimizer, after the DistributedOptimizer was made, so each rank
        would train it on its own gradients (as under Horovod, silently there)."""
        for group in self.param_groups:
            for p in group["params"]:
                warned = self._unreduced_warned.get(id(p))
                if p.grad is not None and p not in self._unit_of and (warned is None or warned() is not p):
                    self._unreduced_warned[id(p)] = weakref.ref(p)
                    named = p in self._parameter_names
                    name = repr(self._parameter_names[p]) if named else f"of shape {tuple(p.shape)}"
                    warnings.warn(f"DistributedOptimizer: parameter {name} has a gradient that is not averaged across "
                                  "ranks: it was not trainable (requires_grad) or not in the optimizer when the "
                                  "DistributedOptimizer was made, so each rank trains it alone. Make the "
                                  "DistributedOptimizer again after changing which parameters train.")

    def _gradients_now(self):
        """Each trainable parameter's gradient tensor, weakly (a gradient set to None is freed)."""
        return [None if p.grad is None else weakref.ref(p.grad) for p in self._requires_update]

    def _unchanged_since(self, synchronized):
        """Whether this is still the iteration synchronize() reduced: step() then has nothing to
        reduce. A new one has begun once this optimizer's zero_grad() ran (it forgets the record), a
        gradient was replaced or set to None (the model's zero_grad()), or a backward started
        reductions; its gradients every rank reduces, whether or not it computed any. Changes in
        place (GradScaler.unscale_, clip_grad_norm_) keep the iteration, as they keep the objects."""
        if synchronized is None:
            return False
        return all((p.grad is None) if grad is None else (grad() is not None and p.grad is grad())
                   for p, grad in zip(self._requires_update, synchronized))

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Context manager under which ``step()`` does not synchronize (after a manual synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    @eager_under_compile
    def step(self, closure=None):
        """Synchronizes the gradients (unless inside skip_synchronize()), then runs the wrapped step.

        Args:
            closure: passed on to the wrapped optimizer's step.
        Returns:
            What the wrapped optimizer's step returns.
        """
        if self._should_synchronize:
            if not self._handles and not self._accumulating() and self._unchanged_since(self._synchronized):
                warnings.warn(_STEP_AFTER_SYNCHRONIZE)
            else:
                self.synchronize()
        self._synchronized = None
        original = self._horo_scheduled() if self._horo_scheduled else None
        if original is not None:
            original._opt_called = True  # an LR scheduler made on it before wrapping checks this
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        """Clears the gradients, as the wrapped optimizer does.

        Args:
            set_to_none: set gradients to None instead of zeros.
        Raises:
            AssertionError: reductions are in flight or gradients are being accumulated (call step()
                or synchronize() first).
        """
        if self._handles or self._accumulating():
            raise AssertionError(_ZERO_GRAD_PENDING)
        self._synchronized = None  # a new iteration: step() reduces whatever it finds
        return super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes):
        """Changes how many backward passes accumulate locally before each reduction.

        Args:
            passes: an integer >= 1.
        Raises:
            ValueError: passes is not a positive integer.
        """
        self.backward_passes_per_step = _check_backward_passes(passes)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def load_state_dict(self, state_dict):
        """Loads the wrapped optimizer's state after finishing any reduction in flight.

        Args:
            state_dict: as for the wrapped optimizer.
        """
        self._drain()
        self._synchronized = None
        self._should_synchronize = True
        result = super().load_state_dict(state_dict)
        original = self._horo_scheduled() if self._horo_scheduled else None
        if original is not None:
            # torch installs new param_groups and state; an LR scheduler made on the wrapped
            # optimizer before wrapping sets the rate in the original's groups, which must stay ours.
            original.param_groups, original.state = self.param_groups, self.state
        return result


# The wrapped class's step is already patched by torch to run the step pre/post hooks around it;
# marking ours as patched keeps torch from wrapping it a second time, so the hooks run once.
_DistributedOptimizer.step.hooked = True


def _check_backward_passes(passes):
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {passes!r}")
    return passes


def _name_parameters(optimizer, named_parameters):
    """parameter -> name for every parameter of the optimizer, validated as Horovod does."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters().")
    counts = collections.Counter(name for name, _ in named)
    duplicates = sorted(str(name) for name, count in counts.items() if count > 1)
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(duplicates))
    names = {id(p): name for name, p in named}
    unnamed = [f"group {i} index {j} shape {tuple(p.shape)}" for i, group in enumerate(optimizer.param_groups)
               for j, p in enumerate(group["params"]) if id(p) not in names]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named: "
                         + ", ".join(unnamed))
    return {p: str(names[id(p)]) for p in params}


def _check_groups(groups, num_groups):
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`.", DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is None:
        return None
    if isinstance(groups, bool) or not isinstance(groups, (int, list)) or (isinstance(groups, int) and groups <= 0):
        raise ValueError(f"groups should be a positive integer or a list of lists of torch.Tensor, got {groups!r}")
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError(f"groups must consist of torch.Tensor, got {type(p).__name__}")
                if id(p) in seen:
                    raise ValueError(f"A parameter can only appear once in groups (shape {tuple(p.shape)} repeats)")
                seen.add(id(p))
    return groups


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a torch optimizer so that ``step()`` uses gradients reduced across ranks.

    Returns an object of a class created on the fly with the wrapped optimizer's class name,
    deriving from that class, so ``isinstance`` checks and schedulers keep working. It takes over
    the wrapped optimizer's parameter groups, defaults, state and hooks (shared, not copied): use
    the returned optimizer from then on. Construct it on every rank of process_set at the same
    point; with ``groups`` the construction itself communicates.

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``model.named_parameters()``: names the reductions (needed when ranks may
            create parameters in different orders) and appears in error messages. Default: names
            from each parameter's position.
        compression: Compression.none, .fp16 or .bf16: the dtype gradients travel in.
        backward_passes_per_step: backward passes accumulated locally before each reduction.
        op: Average (default) or Sum (Min, Max and Product also work on dense gradients).
        gradient_predivide_factor: with Average, gradients are divided by this factor before the
            sum and by size/factor after it.
        num_groups: deprecated spelling of an integer ``groups``.
        groups: an integer n (parameters are split into n fused groups of consecutive parameters)
            or a list of lists of parameters (each list is one fused group; parameters left out
            are reduced one by one).
        sparse_as_dense: reduce sparse gradients as dense tensors instead of by allgather.
        process_set: the ranks whose gradients are reduced together.
    Returns:
        The distributed optimizer.
    Raises:
        ValueError: invalid named_parameters (not (name, tensor) tuples, duplicate names, unnamed
            parameters), gradient_predivide_factor with an op other than Average, invalid groups,
            backward_passes_per_step < 1, an unknown op or an unregistered process set.
    With op=Adasum on more than one rank, the optimizer is Horovod's delta optimizer for Adasum
    (``horo_torch.adasum_optimizer``): each rank's optimizer step is taken locally, per parameter,
    and the changes are combined with Adasum; groups, gradient_predivide_factor and sparse_as_dense
    do not apply then.
    """
    if op not in _OP_NAMES:
        raise ValueError(f"DistributedOptimizer: unknown op {op!r}; use Average, Sum, Min, Max or Product")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError(f"gradient_predivide_factor not supported with op != Average (got op={_OP_NAMES[op]})")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}")
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set() first")
    backward_passes_per_step = _check_backward_passes(backward_passes_per_step)
    groups = _check_groups(groups, num_groups)
    parameter_names = _name_parameters(optimizer, named_parameters)

    base = optimizer.__class__
    adasum = op == Adasum and process_set.included() and process_set.size() > 1
    mixin = _DistributedAdasumOptimizer if adasum else _DistributedOptimizer
    cls = type(base.__name__, (mixin, base), {"__module__": __name__, "__qualname__": base.__name__})
    state = dict(optimizer.__dict__)
    # Methods set on the optimizer instance are bound to the original, not to the distributed one:
    # torch's LR schedulers wrap optimizer.step there, and that wrapper would run the original's
    # plain step, skipping the reduction. They are not carried over; the scheduler's record that
    # step() was called still reaches the original (_DistributedOptimizer.step).
    for key in [k for k, v in state.items() if callable(v) and callable(getattr(cls, k, None))]:
        del state[key]
    scheduled = hasattr(getattr(optimizer, "step", None), "_wrapped_by_lr_sched")
    distributed = cls.__new__(cls)
    distributed.__setstate__(state)
    distributed._horo_scheduled = weakref.ref(optimizer) if scheduled else None
    if adasum:
        distributed._horo_adasum_setup(parameter_names, compression, backward_passes_per_step, process_set,
                                       _ZERO_GRAD_PENDING)
        return distributed
    distributed._horo_setup(parameter_names, compression, backward_passes_per_step, op,
                            float(gradient_predivide_factor), groups, sparse_as_dense, process_set)
    return distributed
