"""``DistributedDataParallel``: PyTorch DDP's interface over Horo's collectives.

How one synchronised iteration goes:

* ``forward`` broadcasts the module's buffers from the set's first rank when the forward before
  it was a synchronising training forward (torch DDP's rule; ``forward_sync_buffers=False`` turns
  it off), then runs the module.
* During backward, a post-accumulate-grad hook on each parameter marks it ready. Parameters are
  grouped into buckets (at most ``bucket_cap_mb`` each, the first at most 1 MiB so that
  communication starts early, one dtype and device per bucket). When every parameter of a bucket is
  ready and every earlier bucket has been launched, the bucket's gradients are copied into one flat
  buffer and handed to the communication hook, which starts an asynchronous allreduce (Average):
  communication overlaps the rest of backward. Launching in bucket order makes every rank issue
  the same collectives in the same order, whatever order its hooks fire in.
* When the backward pass ends, a callback queued on the autograd engine with
  ``Variable._execution_engine.queue_callback`` (by an identity node on the outputs, whose backward
  runs first, so that the callback belongs to the outermost backward even under reentrant
  checkpointing) launches what is left, waits for every bucket and
  writes the averaged gradients into ``.grad``. So when ``loss.backward()`` returns, gradients are
  final on every rank (as with DDP): clipping or inspecting them needs no extra call.

Bucket order. Buckets are first filled in reverse registration order, which approximates the
order gradients become ready. The first synchronised backward records the order the hooks really
fired in; rank 0's record is broadcast (hooks may fire in different orders on different ranks) and
every rank rebuilds its buckets from it, once: the "gradient order prediction" the DDP paper lists
as future work.

Unused parameters. With ``find_unused_parameters=True`` (or ``static_graph=True``), parameters that
got no gradient in a synchronised backward are marked ready at its end (their accumulated gradient,
or zeros, goes into the allreduce); one extra small allreduce counts on how many ranks each
parameter was used, and the gradients of parameters no rank used are left untouched, as DDP does.
With neither, such parameters are still reduced (as zeros) so that no rank waits for ever, and then
``backward`` raises a RuntimeError that names them and suggests ``find_unused_parameters=True``.

Static graph. With ``static_graph=True`` (or ``_set_static_graph()``), the first synchronised
backward launches nothing before its end and counts how often each parameter's gradient is
accumulated; later backwards launch a parameter's bucket only once its gradient has been
accumulated that often. So a module run several times under reentrant activation checkpointing
(``use_reentrant=True``) reduces its whole gradient, as torch DDP's static graph does.

``no_sync()`` skips communication: gradients accumulate locally in ``.grad`` and the first
synchronised backward after it reduces the accumulated values.

``join()`` (uneven inputs) is in horo_torch/_ddp_join.py: ranks that leave it answer the others'
allreduces with zeros until every rank has left.
"""
import contextlib
import threading
import weakref

import torch
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten, tree_unflatten

from horo_core import basics
from horo_core.errors import HoroInvalidArgument
from horo_core.process_sets import global_process_set
from horo_torch import mpi_ops
from horo_torch._compile import eager_under_compile
from horo_torch._ddp_gradients import (flat_gradients, launch_sparse, on_the_wire, raise_if_late, raise_if_unused,
                                       wait_all, write_back)
from horo_torch._ddp_join import JoinMixin
from horo_torch._ddp_setup import (_adopt_torch_sync_batch_norms, _check_devices, _horo_hook_for, _Sink, _to_device,
                                   root_rank, run_comm_hook)
from horo_torch._weak_hooks import remove_when_collected, weak_hook
from horo_torch.functions import _gather_if_different
from horo_torch.comm_hooks import GradBucket, allreduce_hook, fp16_compress_hook
from horo_torch.ddp_buckets import MIB, Bucket, assign_buckets


class DistributedDataParallel(JoinMixin, torch.nn.Module):
    """Wraps a module so that backward averages its gradients across the ranks of a process set.

    Takes torch DDP's arguments, so that a DDP script runs with ``process_set`` in place of
    ``process_group``.

    Args:
        module: the module to replicate; its parameters and buffers are broadcast from the set's first
            rank at construction (unless init_sync is False).
        device_ids: None, or the one device the module is on (torch DDP's single-device form); the
            inputs of forward are moved there, as torch DDP does.
        output_device: None, or that same device (outputs stay where the module puts them).
        dim: accepted for torch DDP compatibility (it applies to multi-device modules only).
        broadcast_buffers: torch's deprecated form of forward_sync_buffers; False also leaves the
            buffers alone at construction.
        init_sync: broadcast parameters and buffers at construction.
        process_group, device_mesh: must be None; Horo's ranks are chosen with process_set.
        bucket_cap_mb: the size limit of a gradient bucket in MiB (the first bucket is at most 1 MiB);
            None: 25.
        find_unused_parameters: mark parameters that got no gradient as ready at the end of backward
            (see the module docstring).
        static_graph: the same parameters get their gradients, as often, in every iteration (see
            the module docstring): unused parameters are then allowed, and so are modules run
            several times under reentrant checkpointing.
        check_reduction, gradient_as_bucket_view, delay_all_reduce_named_params,
            param_to_hook_all_reduce, skip_all_reduce_unused_params, bucket_cap_mb_list,
            batched_grad_copy: accepted for torch DDP compatibility; memory, scheduling and tracing
            hints there, with no effect on the gradients. Here gradients are always copied out of
            the buckets, and every parameter travels in the buckets.
        mixed_precision: must be None (use torch.autocast).
        forward_sync_buffers: broadcast the buffers from the set's first rank at the start of a
            forward that follows a synchronising training forward (torch DDP's rule; so an
            evaluation loop broadcasts once); None: True.
        process_set: the ranks that train together; this rank must be a member.

    Parameters and buffers named in the module's ``_ddp_params_and_buffers_to_ignore`` (torch's
    ``_set_params_and_buffers_to_ignore_for_model``) are neither broadcast nor reduced. Layers of
    ``torch.nn.SyncBatchNorm``, which would synchronise through torch.distributed (not initialised
    under Horo, so they would silently normalise each rank's batch alone), are replaced by
    ``horo_torch.SyncBatchNorm`` over process_set, keeping their parameters and statistics.
    Raises:
        ValueError: bucket_cap_mb is negative, device_ids or output_device name a device the
            module is not on, process_group or device_mesh is given, the set is not registered or
            this rank is not in it.
        NotImplementedError: mixed_precision is given.
        RuntimeError: no parameter of the module (outside those ignored) requires a gradient (torch
            DDP's message); from ``backward``, when neither find_unused_parameters nor static_graph
            is set and parameters got no gradient (after their buckets were reduced, so that the
            other ranks do not wait).
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=None, init_sync=True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False, delay_all_reduce_named_params=None,
                 param_to_hook_all_reduce=None, mixed_precision=None, device_mesh=None,
                 skip_all_reduce_unused_params=False, bucket_cap_mb_list=None, batched_grad_copy=False,
                 forward_sync_buffers=None, process_set=global_process_set):
        super().__init__()
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        if not bucket_cap_mb >= 0:  # 0, as torch allows: one parameter per bucket
            raise ValueError(f"bucket_cap_mb must not be negative, got {bucket_cap_mb}")
        if process_group is not None or device_mesh is not None:
            what = "process_group" if process_group is not None else "device_mesh"
            raise ValueError(f"{what} is torch.distributed's; pass process_set=hvd.ProcessSet(...) to train "
                             "on a subset of the ranks")
        if (delay_all_reduce_named_params is None) != (param_to_hook_all_reduce is None):
            raise ValueError("delay_all_reduce_named_params and param_to_hook_all_reduce need to be set at the same "
                             "time.")
        if mixed_precision is not None:
            raise NotImplementedError("DistributedDataParallel(mixed_precision=...) is not supported by Horo; run the "
                                      "forward under torch.autocast instead")
        self._input_device = _check_devices(module, device_ids, output_device)
        if process_set.process_set_id is None:
            raise HoroInvalidArgument(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) "
                                      "or hvd.add_process_set() first")
        if not process_set.included():
            raise HoroInvalidArgument(f"rank {basics.rank()} is not a member of {process_set}")
        module = _adopt_torch_sync_batch_norms(module, process_set)
        self.module = module
        self.process_set = process_set
        self.process_group = None
        self.device_mesh = None
        self.device_ids = None if device_ids is None else [self._input_device]
        self.output_device = output_device
        self.dim = dim
        self.device = next(iter(module.parameters()), torch.empty(0)).device
        self.mixed_precision = None
        self.static_graph = bool(static_graph)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.require_backward_grad_sync = True
        # torch DDP's rule: buffers are synchronised at a forward only when the forward before it
        # was a synchronising training forward, so that an evaluation loop (no_grad) broadcasts once,
        # not per batch: ranks may then evaluate different numbers of batches.
        self.require_forward_param_sync = True
        if forward_sync_buffers is not None:
            self.forward_sync_buffers = bool(forward_sync_buffers)
            init_sync_buffers = True
        else:
            # broadcast_buffers=False (deprecated in torch 2.13) keeps buffers rank-local at
            # construction too; forward_sync_buffers=False does not.
            self.forward_sync_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
            init_sync_buffers = self.forward_sync_buffers
        # Parameters and buffers left alone (torch's _ddp_params_and_buffers_to_ignore): neither
        # broadcast nor reduced.
        self._ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self.parameters_to_ignore = self._ignored  # torch DDP's attributes of these two, which wrappers read
        self.bucket_bytes_cap = int(bucket_cap_mb * MIB)
        self._join = None  # the options of the join() context this rank is in, or None
        self._grad_scale = 1.0  # join(divide_by_initial_world_size=False): size / ranks still training
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad and n not in self._ignored]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter "
                               "that requires a gradient.")
        self._param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._bucket_cap_bytes = max(1, int(bucket_cap_mb * MIB))
        self._prefix = basics.auto_name("ddp", process_set.process_set_id)
        self._root = root_rank(process_set)
        self._comm_state, self._comm_hook, self._hook_registered = None, allreduce_hook, False
        self._generation = 0
        self._rebuilt = False
        self._buckets, self._bucket_of = [], {}
        # Embedding layers with sparse=True give sparse gradients, reduced apart (as torch DDP does).
        sparse_weights = {id(m.weight) for m in module.modules()
                          if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse}
        self._sparse = {i for i, p in enumerate(self._params) if id(p) in sparse_weights}
        self._set_buckets(self._layout(list(reversed(range(len(self._params))))))
        self._sync_this_backward = True
        # A backward reduces only after a forward of this wrapper (with gradients on) armed it, and
        # only once: a second backward through the same graph, or one through the module alone,
        # accumulates locally, as with torch DDP (a rank-local extra backward would otherwise send
        # collectives the other ranks never match).
        self._armed = False
        self._used_since_sync = set()
        # static_graph: how often each parameter's gradient is accumulated in one backward, as the
        # first synchronised backward counted (None until then).
        self._expected_hits = None
        # How often each gradient arrived in the first synchronised backward, and whether every one
        # since matched it (_get_ddp_logging_data's can_set_static_graph).
        self._first_hits, self._graph_static = None, True
        self._callback_queued = False
        self._lock = threading.Lock()  # hooks of parameters on different devices run on different threads
        self._reset_iteration()
        self._verify_same_model()
        if init_sync:
            self._broadcast_state(init_sync_buffers)
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                              for i, p in enumerate(self._params)]
        remove_when_collected(self, self._hook_handles)  # the module may be wrapped again

    # Public interface ----------------------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        """Broadcasts buffers from the set's first rank (see will_sync_module_buffers), then runs the
        wrapped module.

        Returns:
            Whatever the module returns.
        """
        if torch.autograd.profiler._is_profiler_enabled:
            with torch.autograd.profiler.record_function("DistributedDataParallel.forward"):  # torch DDP's range
                return self._forward(inputs, kwargs)
        return self._forward(inputs, kwargs)

    def _forward(self, inputs, kwargs):
        self._pre_forward()
        if self._input_device is not None:
            inputs, kwargs = _to_device(inputs, self._input_device), _to_device(kwargs, self._input_device)
        output = self.module(*inputs, **kwargs)
        return self._post_forward(output)

    @property
    def broadcast_buffers(self):
        """torch DDP's (deprecated) name for forward_sync_buffers."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value):
        self.forward_sync_buffers = bool(value)

    def will_sync_module_buffers(self):
        """Whether the next forward broadcasts the buffers: they are synchronised, and the forward
        before was a training forward outside no_sync() (torch DDP's rule)."""
        return self.require_forward_param_sync and self.forward_sync_buffers and bool(self._buffers_to_sync())

    def _set_static_graph(self):
        """torch DDP's static_graph=True, set after construction (before the first backward)."""
        self.static_graph = True

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore):
        """Names parameters and buffers (fully qualified, e.g. ``"fc.bias"``) that a wrapper of
        module made after this call neither broadcasts nor reduces (torch DDP's method)."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore
        names = set(params_and_buffers_to_ignore)
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if name in names:
                tensor._ddp_ignored = True

    @contextlib.contextmanager
    def no_sync(self):
        """Context manager that turns gradient synchronisation off for the forwards run inside it.

        Gradients accumulate in ``.grad``; the first backward of a forward run outside the context
        reduces the accumulated gradients.
        """
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state, hook):
        """Replaces how a bucket of gradients is communicated (DDP's ``register_comm_hook``).

        Args:
            state: passed as the first argument to every call of hook.
            hook: ``hook(state, bucket: GradBucket) -> future``; the future's ``wait()`` returns a flat
                tensor with the bucket's number of elements, written back into the gradients.
                ``horo_torch.comm_hooks`` provides allreduce_hook, fp16_compress_hook and
                bf16_compress_hook; torch's default hooks of those names (with state None) are
                replaced by them, and torch's fp16/bf16_compress_wrapper and noop_hook work as they
                are. Sparse gradients (Embedding(sparse=True)) do not pass through the hook.
        Raises:
            TypeError: hook is not callable.
            RuntimeError: a hook was already registered.
            NotImplementedError: hook is one of torch's hooks that communicate through
                torch.distributed (PowerSGD, quantisation, local SGD).
        """
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        if self._hook_registered:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        hook = _horo_hook_for(hook, state)
        self._comm_state, self._comm_hook, self._hook_registered = state, hook, True

    def _register_builtin_comm_hook(self, comm_hook_type):
        """Registers one of torch's built-in hooks by its ``torch.distributed.BuiltinCommHookType``
        (torch DDP's private method of this name, which some scripts call): ALLREDUCE registers
        ``comm_hooks.allreduce_hook``, FP16_COMPRESS ``comm_hooks.fp16_compress_hook``.

        Raises:
            TypeError: comm_hook_type is not one of those two.
            RuntimeError: a hook was already registered.
        """
        hook = None
        if type(comm_hook_type).__name__ == "BuiltinCommHookType":  # torch's enum, where distributed is built
            hook = {"ALLREDUCE": allreduce_hook, "FP16_COMPRESS": fp16_compress_hook}.get(comm_hook_type.name)
        if hook is None:
            raise TypeError(f"_register_builtin_comm_hook: expected torch.distributed.BuiltinCommHookType "
                            f"ALLREDUCE or FP16_COMPRESS, got {comm_hook_type!r}")
        self.register_comm_hook(None, hook)

    @property
    def buckets(self):
        """The current buckets in launch order, each a tuple of parameter names (for logs and tests)."""
        return tuple(tuple(self._param_names[i] for i in b.indices) for b in self._buckets)

    @property
    def buckets_rebuilt(self):
        """Whether the buckets were rebuilt from the observed gradient order."""
        return self._rebuilt

    def _get_ddp_logging_data(self):
        """torch DDP's private summary of the wrapper, the keys Horo can answer (integers for
        flags, as torch's). ``can_set_static_graph`` appears after the first synchronised
        backward: 1 while every such backward has accumulated each parameter's gradient as often
        as the first did (the same parameters used, each as many times), so that
        ``static_graph=True`` would do (torch's test of the same name); 1 under static_graph."""
        data = {
            "backend_name": "horo",
            "module_name": type(self.module).__name__,
            "world_size": self.process_set.size(),
            "rank": self.process_set.rank(),
            "device_ids": "" if self.device_ids is None else ", ".join(map(str, self.device_ids)),
            "output_device": -1 if self.output_device is None else str(self.output_device),
            "broadcast_buffers": int(self.forward_sync_buffers),
            "bucket_cap_bytes": self.bucket_bytes_cap,
            "find_unused_parameters": int(self.find_unused_parameters),
            "gradient_as_bucket_view": int(self.gradient_as_bucket_view),
            "static_graph": int(self.static_graph),
            "has_rebuilt_buckets": int(self._rebuilt),
        }
        if self._first_hits is not None:
            data["can_set_static_graph"] = int(self.static_graph or self._graph_static)
        return data

    # Copies (copy.deepcopy, pickle, torch.save) -----------------------------------------------------

    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        for key in ("_lock", "_hook_handles"):
            state.pop(key, None)
        state["_futures"] = [None] * len(state.get("_buckets", ()))
        state["_callback_queued"] = False
        state["_armed"] = False
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._lock = threading.Lock()
        # A name of its own, so that the copy and the original may both reduce in one backward
        # (ranks copy in the same order, so they agree on it).
        self._prefix = basics.auto_name("ddp", self.process_set.process_set_id or 0)
        self._set_buckets([b.indices for b in self._buckets])
        # The copy's parameters are new tensors without the original's hooks: hook them here.
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                              for i, p in enumerate(self._params)]
        remove_when_collected(self, self._hook_handles)

    # Forward helpers (run eagerly when torch.compile traces the wrapper: they talk to Horo; see
    # horo_torch/_compile.py) -----------------------------------------------------------------

    @staticmethod
    def _in_backward():
        """True while autograd runs a backward on this thread: a forward run then is a recompute
        (activation checkpointing), which must leave the iteration's state alone."""
        return torch._C._current_graph_task_id() != -1

    @eager_under_compile
    def _pre_forward(self):
        if self._in_backward():
            return
        if self._callback_queued:  # a previous backward failed before its end-of-backward callback ran
            self._abandon_iteration()
        if torch.is_grad_enabled():
            self._sync_this_backward = self.require_backward_grad_sync
        if self._join is not None:
            self._sync_while_joining()
        elif self.will_sync_module_buffers():
            self._broadcast_buffers()

    @eager_under_compile
    def _post_forward(self, output):
        if self._in_backward():
            return output
        synchronising = torch.is_grad_enabled() and self.require_backward_grad_sync
        self.require_forward_param_sync = synchronising
        if not torch.is_grad_enabled():
            return output
        self._armed = True
        # The outputs pass through a node whose backward runs first in the backward pass and there
        # queues the end-of-backward callback, on the outermost backward (torch's _DDPSink). A
        # callback queued by the first parameter hook instead would end with the inner backward of
        # a reentrant checkpoint. Outputs that are not lists, tuples or dicts of tensors keep that.
        leaves, spec = tree_flatten(output)
        positions = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not positions:
            return output
        passed = _Sink.apply(weakref.ref(self), *[leaves[i] for i in positions])
        for i, t in zip(positions, passed):
            leaves[i] = t
        return tree_unflatten(leaves, spec)

    @eager_under_compile
    def _queue_finish(self):
        if not self._callback_queued and self._armed:
            self._reset_iteration()
            self._callback_queued = True
            Variable._execution_engine.queue_callback(self._finish_backward)

    # Construction helpers ------------------------------------------------------------------------

    def _layout(self, order):
        """Buckets for the parameter indices in order: the dense ones by assign_buckets, then one
        bucket per parameter with sparse gradients."""
        dense = [i for i in order if i not in self._sparse]
        return assign_buckets(self._params, dense, self._bucket_cap_bytes) + [[i] for i in order if i in self._sparse]

    def _set_buckets(self, groups):
        self._buckets = [Bucket(g, [self._params[i] for i in g], f"{self._prefix}.g{self._generation}.bucket.{k}",
                                 sparse=g[0] in self._sparse)
                         for k, g in enumerate(groups)]
        self._bucket_of = {i: k for k, g in enumerate(groups) for i in g}

    def _params_to_sync(self):
        return [p for n, p in self.module.named_parameters() if n not in self._ignored]

    def _buffers_to_sync(self):
        return [b for n, b in self.module.named_buffers() if n not in self._ignored]

    def _verify_same_model(self):
        """Raises RuntimeError on every rank of the set when the ranks' parameters differ in number,
        shape or dtype, as torch DDP does at construction: their buckets and broadcasts would not
        match, and the ranks would wait for each other. Also compares the buffers that forwards
        broadcast. One 8-byte allgather when the models agree."""
        def layout(tensors):
            return [(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in tensors]
        mine = (layout(self._params), layout(self._buffers_to_sync()))
        models = _gather_if_different(mine, f"{self._prefix}.model", self.process_set)
        if models is None:
            return
        members = self.process_set._members()
        me = basics.rank()
        own_params, own_buffers = mine
        for rank, (params, buffers) in zip(members, models):
            if len(params) != len(own_params):
                raise RuntimeError(f"DDP expects same model across all ranks, but Rank {me} has {len(own_params)} "
                                   f"params, while rank {rank} has inconsistent {len(params)} params.")
        for rank, (params, buffers) in zip(members, models):
            for index, (a, b) in enumerate(zip(own_params, params)):
                if a != b:
                    raise RuntimeError(f"DDP expects same model across all ranks: params[{index}] "
                                       f"({self._param_names[index]}) in this process (rank {me}) with sizes "
                                       f"{list(a[0])} and dtype {a[1]} appears not to match sizes and dtype "
                                       f"{list(b[0])} {b[1]} of the same param in rank {rank}.")
            if buffers != own_buffers:
                raise RuntimeError(f"DDP expects same model across all ranks, but Rank {me} has buffers "
                                   f"{_shapes(own_buffers)}, while rank {rank} has inconsistent buffers "
                                   f"{_shapes(buffers)}.")

    def _broadcast_state(self, buffers=True):
        """Copies parameters (and buffers) from the set's first rank."""
        tensors = [("param", i, p) for i, p in enumerate(self._params_to_sync())]
        if buffers:
            tensors += [("buffer", i, b) for i, b in enumerate(self._buffers_to_sync())]
        self._broadcast(tensors)

    def _broadcast_buffers(self):
        self._broadcast([("buffer", i, b) for i, b in enumerate(self._buffers_to_sync())])

    def _broadcast(self, tensors, root=None):
        if self.process_set.size() == 1 or not tensors:
            return
        root = self._root if root is None else root
        with torch.no_grad():
            handles = [mpi_ops.broadcast_async_(on_the_wire(t), root, name=f"{self._prefix}.{kind}.{i}",
                                                process_set=self.process_set) for kind, i, t in tensors]
            wait_all(handles)

    # Backward ------------------------------------------------------------------------------------

    def _make_hook(self, index):
        return weak_hook(self, "_on_grad_ready", index)

    def _reset_iteration(self):
        self._ready = [False] * len(self._params)
        self._pending = [len(b.indices) for b in self._buckets]
        self._futures = [None] * len(self._buckets)
        self._next_launch = 0
        self._observed = []
        self._late = set()
        self._hits = [0] * len(self._params)

    def _on_grad_ready(self, index):
        if self._params[index].grad is None:
            # The engine runs the hook even where no gradient arrived (an output the loss left out,
            # whose gradient _Sink passes on as None): the parameter was not used.
            return
        with self._lock:
            self._mark_ready(index)

    def _mark_ready(self, index):
        if not self._callback_queued:
            if not self._armed:
                return  # no forward of this wrapper since the last backward: accumulate locally
            self._queue_finish()
        if self._sync_this_backward:
            self._hits[index] += 1
            if self.static_graph and self._expected_hits is not None and self._hits[index] < self._expected_hits[index]:
                return  # more of this parameter's gradient is still to come in this backward
        if self._ready[index]:
            # A second accumulation in one backward (reentrant checkpointing runs one backward per
            # segment): fine while its bucket waits, stale once the bucket went out.
            if self._sync_this_backward and self._bucket_of[index] < self._next_launch:
                self._late.add(index)
            return
        self._ready[index] = True
        self._observed.append(index)
        self._used_since_sync.add(index)
        if self._sync_this_backward:
            self._pending[self._bucket_of[index]] -= 1
            if not self.static_graph or self._expected_hits is not None:
                self._launch_ready_buckets()  # the first static backward launches at its end

    def _launch_ready_buckets(self):
        while self._next_launch < len(self._buckets) and self._pending[self._next_launch] == 0:
            k = self._next_launch
            bucket = self._buckets[k]
            if bucket.sparse and self._join is None:
                # Ranks that left join() answer allreduces only: inside it the bucket goes dense.
                self._futures[k] = launch_sparse(bucket, self.process_set)
                self._next_launch += 1
                continue
            grad_bucket = GradBucket(k, bucket.name, flat_gradients(bucket), bucket.params, k == len(self._buckets) - 1,
                                     self.process_set)
            self._futures[k] = run_comm_hook(self._comm_hook, self._comm_state, grad_bucket)
            self._next_launch += 1

    @eager_under_compile
    def _finish_backward(self):
        """Runs once at the end of a backward pass: completes and waits for the communication."""
        if not self._observed:
            # No parameter got a gradient: not the training backward (torch.autograd.grad through
            # the outputs, e.g. for a gradient penalty). The forward stays armed for that one.
            self._callback_queued = False
            return
        try:
            if self._sync_this_backward:
                self._synchronize_gradients()
        finally:
            self._callback_queued = False
            self._armed = False

    def _synchronize_gradients(self):
        if self._first_hits is None:
            self._first_hits = list(self._hits)
        elif self._hits != self._first_hits:
            self._graph_static = False
        if self.static_graph and self._expected_hits is None:
            self._expected_hits = list(self._hits)
        missing = [i for i, ready in enumerate(self._ready) if not ready]
        for i in missing:
            self._pending[self._bucket_of[i]] -= 1
        self._launch_ready_buckets()
        usage = None
        if self.find_unused_parameters or self.static_graph:
            used = torch.zeros(len(self._params), dtype=torch.int32)
            used[torch.tensor(sorted(self._used_since_sync), dtype=torch.long)] = 1
            usage = mpi_ops.allreduce_(used, name=f"{self._prefix}.usage", op=mpi_ops.Sum,
                                       process_set=self.process_set)
        results = wait_all(self._futures)
        self._futures = [None] * len(self._buckets)
        self._used_since_sync = set()
        # Under join(divide_by_initial_world_size=False), the division by the ranks still training:
        # torch makes it for its own reduction only and leaves it to a registered hook, as here.
        write_back(self._buckets, results, usage, self._grad_scale,
                   1.0 if self._hook_registered else self._grad_scale)
        late = sorted(self._late)
        if not self._rebuilt:  # before raising: every rank must take part in the rebuild's broadcast
            self._rebuild_buckets()
        raise_if_late(late, self._param_names)
        if not (self.find_unused_parameters or self.static_graph):
            raise_if_unused(missing, self._param_names)

    def _rebuild_buckets(self):
        """Rebuilds the buckets, once, from rank 0's observed gradient order."""
        seen = set(self._observed)
        order = self._observed + [i for b in self._buckets for i in b.indices if i not in seen]
        agreed = torch.tensor(order, dtype=torch.int64)
        if self._join is not None and "source" in self._join:
            # Ranks that left join() answer allreduces only: the highest rank still training contributes.
            if basics.rank() != self._join["source"]:
                agreed.zero_()
            mpi_ops.allreduce_(agreed, name=f"{self._prefix}.rebuild", op=mpi_ops.Sum, process_set=self.process_set)
        elif self.process_set.size() > 1:
            mpi_ops.broadcast_(agreed, self._root, name=f"{self._prefix}.rebuild", process_set=self.process_set)
        self._generation += 1
        self._set_buckets(self._layout(agreed.tolist()))
        self._rebuilt = True
        self._reset_iteration()

    def _abandon_iteration(self):
        """Waits out the collectives of a backward that failed midway, so that none stays in flight."""
        try:
            wait_all([f for f in self._futures if f is not None])
        except Exception:  # noqa: BLE001 - the failure was already reported by the failed backward
            pass
        self._callback_queued = False
        self._used_since_sync = set()
        self._reset_iteration()


def _shapes(layout):
    """A layout of (shape, dtype) pairs as a short text: [[4, 4] float32, [4] int64]."""
    return "[" + ", ".join(f"{list(shape)} {dtype}" for shape, dtype in layout) + "]"
