"""Helpers that bring every rank to the same starting point, and the sparse gradient reduction.

``broadcast_parameters`` and ``broadcast_optimizer_state`` copy a model and an optimizer from one
rank to all others with in-place tensor broadcasts. ``broadcast_object`` and ``allgather_object``
move arbitrary Python objects: they are the only functions of horo_torch that serialise objects
(cloudpickle into a uint8 tensor, sent as its size and then its bytes, as Horovod does), so only
call them with data you trust from the ranks of your own job.

``sparse_allreduce_async`` reduces a sparse COO gradient by gathering every rank's indices and
values, which is how DistributedOptimizer handles ``nn.Embedding(sparse=True)``.
"""
import hashlib
import operator

import torch

from horo_core import basics, object_bytes
from horo_core.process_sets import global_process_set
from horo_torch._compile import eager_under_compile
from horo_torch.mpi_ops import (Average, Sum, allgather_async, broadcast_async_, synchronize)


# Python objects ----------------------------------------------------------------------------------

def _bytes_tensor(payload):
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)


def _helper_name(kind, name, process_set):
    """The name of an object helper's call: the given one, else the next of the helper's own call
    order (as in horo_tf). Not the order of the unnamed collectives: a rank whose unnamed allgather
    failed alone (a peer had joined) would otherwise name every later helper call differently."""
    return name if name is not None else basics.auto_name(kind, process_set.process_set_id)


@eager_under_compile
def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Sends a picklable Python object from root_rank to every rank of process_set.

    The root serialises obj with cloudpickle into a uint8 tensor and broadcasts its length, then
    its bytes; the other ranks deserialise what they receive. Deserialising runs code chosen by
    the sender, as any unpickling does: use it only within your own job.

    Args:
        obj: the object on root_rank; ignored on the other ranks (pass None there).
        root_rank: the global rank whose object is sent.
        name: names the two broadcasts; when None they are named by the order of unnamed
            broadcast_object calls, which every rank must then make in the same order.
        process_set: the ranks taking part; root_rank must be one of them.
    Returns:
        root_rank's object (on root_rank, obj itself).
    Raises:
        ValueError: invalid root_rank or process set, or the root could not pickle obj (on every
            rank, after the broadcasts, so that later calls stay paired). HorovodInternalError:
            the broadcast failed.
    """
    name = _helper_name("broadcast_object", name, process_set)
    is_root = basics.rank() == root_rank
    payload, error = object_bytes.serialise(obj) if is_root else (b"", None)
    length = torch.tensor([object_bytes.announced_length(payload, error)], dtype=torch.int64)
    synchronize(broadcast_async_(length, root_rank, f"{name}.sz", process_set))
    data = _bytes_tensor(payload) if is_root else torch.empty(abs(int(length.item())), dtype=torch.uint8)
    synchronize(broadcast_async_(data, root_rank, f"{name}.t", process_set))
    if is_root and error is None:
        return obj
    return object_bytes.broadcast_object("broadcast_object", name, int(length.item()), data.numpy().tobytes(),
                                         root_rank, error)


@eager_under_compile
def allgather_object(obj, name=None, process_set=global_process_set):
    """Gathers a picklable Python object from every rank of process_set.

    Every rank serialises obj with cloudpickle into a uint8 tensor; the lengths and then the bytes
    are allgathered and deserialised. Deserialising runs code chosen by the sender, as any
    unpickling does: use it only within your own job.

    Args:
        obj: this rank's object; objects may differ in type and size between ranks.
        name: names the two allgathers; when None they are named by the order of unnamed
            allgather_object calls.
        process_set: the ranks taking part (Horovod's version always uses every rank).
    Returns:
        A list with one object per rank of process_set, in rank order.
    Raises:
        ValueError: a rank could not pickle its object (on every rank, after the allgathers).
        HorovodInternalError: an allgather failed.
    """
    name = _helper_name("allgather_object", name, process_set)
    payload, error = object_bytes.serialise(obj)
    length = torch.tensor([object_bytes.announced_length(payload, error)], dtype=torch.int64)
    lengths_handle = allgather_async(length, f"{name}.sz", process_set)
    data_handle = allgather_async(_bytes_tensor(payload), f"{name}.t", process_set)
    lengths = synchronize(lengths_handle).tolist()
    data = synchronize(data_handle).numpy().tobytes()
    return object_bytes.objects("allgather_object", name, lengths, data, process_set.ranks, error)


# Model parameters --------------------------------------------------------------------------------

@eager_under_compile
def broadcast_parameters(params, root_rank, prefix="Parameter.", process_set=global_process_set):
    """Overwrites, in place, every rank's tensors with root_rank's.

    Args:
        params: a dict of name -> tensor (``model.state_dict()``; sent in sorted name order), or a
            list/iterable of ``(name, tensor)`` pairs (``model.named_parameters()``) or of tensors.
            Every rank must pass the same names, shapes and dtypes.
        root_rank: the global rank whose values are sent.
        prefix: prepended to each name to name the broadcasts.
        process_set: the ranks taking part.
    Returns:
        None.
    Raises:
        ValueError: params is not a dict or iterable, or an entry is not a tensor; on every rank of
            process_set, when a rank's entries are not tensors or differ from root_rank's in number,
            names, shapes or dtypes (found before anything is sent, at the cost of one 8-byte
            allgather).
        HorovodInternalError: a broadcast failed.
    """
    if isinstance(params, dict):
        entries = sorted(params.items(), key=lambda item: str(item[0]))
    elif isinstance(params, torch.Tensor) or not hasattr(params, "__iter__"):
        raise ValueError(f"broadcast_parameters: params must be a dict or a list of (name, tensor) pairs, "
                         f"got {type(params).__name__}")
    else:
        entries = [item if isinstance(item, tuple) else (None, item) for item in params]
    layout = _parameters_layout(entries)
    _broadcast_parameters_check(layout, root_rank, prefix, process_set)
    if isinstance(layout, str):  # every rank found the same problem
        raise ValueError(f"broadcast_parameters: {layout}")
    handles = [broadcast_async_(tensor, root_rank, f"{prefix}{label}", process_set)
               for (label, _, _), (_, tensor) in zip(layout, entries)]
    failure = None
    for handle in handles:
        try:
            synchronize(handle)
        except Exception as exc:  # noqa: BLE001 - raised below, once no broadcast of the call is left in flight
            failure = failure or exc
    if failure is not None:
        raise failure


def _parameters_layout(entries):
    """What broadcast_parameters sends, as the ranks compare it: (name, shape, dtype) per entry, or
    the text of this rank's first entry that is not a (name, tensor) pair."""
    layout = []
    for index, entry in enumerate(entries):
        if len(entry) != 2:
            return f"entry {index} is a tuple of {len(entry)} items; want (name, tensor)"
        name, tensor = entry
        label = index if name is None else name
        if not isinstance(tensor, torch.Tensor):
            return f"'{label}' is a {type(tensor).__name__}, not a tensor; send other objects with broadcast_object"
        layout.append((str(label), tuple(tensor.shape), str(tensor.dtype).replace("torch.", "")))
    return layout


def _describe_entry(entry):
    if entry is None:
        return "nothing"
    label, shape, dtype = entry
    return f"'{label}' {list(shape)} {dtype}"


def _first_difference(mine, theirs):
    """The first position where two layouts of (label, shape, dtype) differ, described."""
    for index in range(max(len(mine), len(theirs))):
        a = mine[index] if index < len(mine) else None
        b = theirs[index] if index < len(theirs) else None
        if a != b:
            return index, _describe_entry(a), _describe_entry(b)
    return None


def _broadcast_parameters_check(layout, root_rank, prefix, process_set):
    """Raises ValueError, on every rank of process_set, when the ranks pass different root ranks, or
    a rank's entries are not tensors or differ from root_rank's in number, names, shapes or dtypes:
    such ranks would otherwise send broadcasts that their peers never match and wait for each
    other forever."""
    gathered = _gather_if_different((_rank_value(root_rank), layout), f"{prefix}layout", process_set)
    if gathered is None:
        return
    members = process_set._members()
    roots = {rank: root for rank, (root, _) in zip(members, gathered)}
    if len({repr(root) for root in roots.values()}) > 1:
        raise ValueError("broadcast_parameters: every rank must pass the same root_rank: " +
                         ", ".join(f"rank {rank} passed {root!r}" for rank, root in roots.items()))
    own = {rank: value for rank, (_, value) in zip(members, gathered)}
    problems = [f"rank {rank}: {value}" for rank, value in own.items() if isinstance(value, str)]
    if not problems:
        root = _rank_value(root_rank)
        reference = own.get(root) if isinstance(root, int) else None
        if reference is None:  # an invalid root: the broadcasts will say so
            return
        for rank, value in own.items():
            if rank == root or value == reference:
                continue
            index, got, want = _first_difference(value, reference)
            problems.append(f"rank {rank} has {len(value)} tensors, root rank {root_rank} {len(reference)}; at "
                            f"position {index} rank {rank} has {got} where the root has {want}")
    raise ValueError("broadcast_parameters: every rank must pass the same names, shapes and dtypes: " +
                     "; ".join(problems))


def _rank_value(root_rank):
    """root_rank as the ranks compare it: an int for any integer type (NumPy's, a tensor's), else
    the value itself, which the broadcasts refuse."""
    try:
        return operator.index(root_rank)
    except TypeError:
        return root_rank


def _gather_if_different(layout, name, process_set=global_process_set):
    """Every rank's layout (a picklable value whose repr identifies it), in the order of
    process_set's ranks, when they are not all equal; None when they are. Agreeing costs one 8-byte
    allgather of a digest of repr(layout); only a disagreement gathers the layouts themselves."""
    if process_set.size() == 1:
        return None
    digest = int.from_bytes(hashlib.blake2b(repr(layout).encode(), digest_size=8).digest(), "little", signed=True)
    digests = synchronize(allgather_async(torch.tensor([digest], dtype=torch.int64), f"{name}.digest", process_set))
    if bool((digests == digests[0]).all()):
        return None
    return allgather_object(layout, name=f"{name}.all", process_set=process_set)


# Optimizer state ---------------------------------------------------------------------------------

class _TensorSlot:
    """Stands for one state tensor in the structure the root sends: its shape and dtype."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def __getstate__(self):
        return self.shape, self.dtype

    def __setstate__(self, state):
        self.shape, self.dtype = state


def _parameter_layout(optimizer):
    return [[tuple(p.shape) for p in group["params"]] for group in optimizer.param_groups]


def _optimizer_class(optimizer):
    """The name of optimizer's torch class (the one DistributedOptimizer wraps, for a wrapped one)."""
    cls = next(c for c in type(optimizer).__mro__ if not c.__module__.startswith("horo_torch"))
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe_root_state(optimizer):
    """What non-root ranks need to rebuild root's state: hyper-parameters, non-tensor state values
    and the shape/dtype of every state tensor; plus the list of state tensors in sending order."""
    state_dict = optimizer.state_dict()
    tensors = []
    state = {}
    for param_id, entries in state_dict["state"].items():
        described = {}
        for key, value in entries.items():
            if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                described[key] = _TensorSlot(tuple(value.shape), value.dtype)
                tensors.append(value)
            else:
                # Sparse state (SGD's momentum for a sparse embedding) travels pickled with the rest:
                # an in-place broadcast needs a dense buffer.
                described[key] = value
        state[param_id] = described
    structure = {
        "layout": _parameter_layout(optimizer),
        "class": _optimizer_class(optimizer),
        "param_groups": [{k: v for k, v in group.items() if k != "params"} for group in state_dict["param_groups"]],
        "state": state,
    }
    return structure, tensors


@eager_under_compile
def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Makes every rank's optimizer state and hyper-parameters identical to root_rank's.

    Unlike Horovod's version, this never runs an optimizer step to create missing state, so it
    does not change the training trajectory: a freshly created optimizer stays fresh (Adam's step
    counter stays at zero), and only the hyper-parameters (lr, betas, ...) travel. When the root
    has state, its structure and every non-tensor value (Python step counters, None entries, ...)
    travel through broadcast_object (cloudpickle), sparse state tensors with them, and every dense
    state tensor through an in-place broadcast; the non-root ranks then install the result with
    ``optimizer.load_state_dict``, keeping their own param_groups list and dicts and state dict
    (root's values are written into them), as Horovod does.

    Args:
        optimizer: a torch optimizer, or one returned by DistributedOptimizer, with the same
            parameter groups (same shapes in the same order) on every rank.
        root_rank: the global rank whose state is sent.
        model: accepted for compatibility with Horovod's signature; not used.
    Returns:
        None.
    Raises:
        ValueError: on every rank, when the optimizers' parameter layouts differ between ranks.
        HorovodInternalError: a broadcast failed.
    """
    del model  # part of Horovod's signature only
    is_root = basics.rank() == root_rank
    structure, tensors = _describe_root_state(optimizer) if is_root else (None, [])
    structure = broadcast_object(structure, root_rank, name="optimizer_state.structure")

    layout, kind = _parameter_layout(optimizer), _optimizer_class(optimizer)
    problem = None
    if kind != structure["class"]:
        # Root's hyper-parameters would replace this optimizer's (an Adam's betas for an SGD's
        # momentum), which would then fail in step() on this rank alone.
        problem = f"the optimizer is {kind} on rank {basics.rank()}, {structure['class']} on root rank {root_rank}"
    elif layout != structure["layout"]:
        problem = (f"the optimizer's parameter groups differ from root rank {root_rank}'s {structure['layout']}: "
                   f"rank {basics.rank()} has parameter shapes {layout}")
    problems = [p for p in allgather_object(problem, name="optimizer_state.layout") if p is not None]
    if problems:
        raise ValueError("broadcast_optimizer_state: " + "; ".join(problems))

    handles, received = [], {}
    sent = iter(tensors)
    for param_id, entries in structure["state"].items():
        for key, slot in entries.items():
            if not isinstance(slot, _TensorSlot):
                continue
            if is_root:
                buffer = next(sent).detach().reshape(-1)
            else:
                buffer = torch.empty(int(torch.Size(slot.shape).numel()), dtype=slot.dtype)
                received[(param_id, key)] = buffer
            handles.append(broadcast_async_(buffer, root_rank, f"optimizer_state.{param_id}.{key}"))
    for handle in handles:
        synchronize(handle)
    if is_root:
        return

    local_groups = optimizer.state_dict()["param_groups"]
    state = {}
    for param_id, entries in structure["state"].items():
        state[param_id] = {key: received[(param_id, key)].view(slot.shape) if isinstance(slot, _TensorSlot)
                           else slot for key, slot in entries.items()}
    groups = [dict(hyper, params=local["params"]) for hyper, local in zip(structure["param_groups"], local_groups)]
    _load_keeping_groups(optimizer, {"state": state, "param_groups": groups})


def _load_keeping_groups(optimizer, state_dict):
    """optimizer.load_state_dict, with what it loads written into the optimizer's own param_groups
    list and dicts and its own state dict, as Horovod's in-place update does. load_state_dict alone
    installs new ones, and whatever held the old ones would then see values no step uses: an LR
    scheduler made on the optimizer before DistributedOptimizer wrapped it (ReduceLROnPlateau sets
    the rate in those dicts), the optimizer a DistributedOptimizer wraps (it shares both with it),
    or a script's own reference to a group."""
    groups, state = optimizer.param_groups, optimizer.state
    own = list(groups)
    optimizer.load_state_dict(state_dict)
    for mine, loaded in zip(own, optimizer.param_groups):
        if loaded is not mine:  # an optimizer whose load_state_dict updates its dicts in place
            mine.clear()
            mine.update(loaded)
    loaded_state = optimizer.state
    if loaded_state is not state:
        state.clear()
        state.update(loaded_state)
    groups[:] = own
    # DistributedOptimizer.load_state_dict pointed the optimizer it wrapped at the new ones.
    scheduled = getattr(optimizer, "_horo_scheduled", None)
    original = scheduled() if scheduled is not None else None
    for holder in (optimizer, original):
        for attribute, kept in (("param_groups", groups), ("state", state)):
            if holder is not None and getattr(holder, attribute) is not kept:
                try:
                    setattr(holder, attribute, kept)
                except AttributeError:  # a read-only property (a wrapper that forwards to its optimizer)
                    pass


# Sparse gradients --------------------------------------------------------------------------------

@eager_under_compile
def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor across ranks by allgathering its indices and values.

    The result holds every rank's entries side by side (entries at the same index add up when the
    tensor is used or coalesced); for Average the values are divided by the set size (integer values
    after they add up, with truncation, as in a dense Average; the result is then coalesced).

    Args:
        tensor: a sparse COO tensor of the same dense shape on every rank.
        name: names the two allgathers (``<name>.indices`` and ``<name>.values``); None names them
            by the order of unnamed sparse_allreduce_async calls.
        op: Average or Sum.
        process_set: the ranks taking part.
    Returns:
        A callable that waits for the allgathers and returns the reduced sparse tensor.
    Raises:
        ValueError: tensor is not sparse COO, or op is neither Average nor Sum.
    """
    if tensor.layout != torch.sparse_coo:
        raise ValueError(f"sparse_allreduce_async('{name}'): want a sparse COO tensor, got layout {tensor.layout}")
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async('{name}'): sparse tensors can only be reduced with Average or "
                         f"Sum (got op {op}); use sparse_as_dense=True for other ops")
    coalesced = tensor.coalesce()
    # Allgather concatenates along dimension 0, so indices travel as (nnz, sparse_dims), after a
    # row that gives the sizes of the sparse dimensions as -(size + 1): negative, so no index can be
    # taken for it, and every rank learns every rank's dense shape (the values' allgather compares
    # only the dense dimensions).
    sparse_sizes = list(tensor.shape[:coalesced.sparse_dim()])
    indices = coalesced.indices()
    marked = torch.cat([torch.tensor([[-(s + 1) for s in sparse_sizes]], dtype=indices.dtype, device=indices.device),
                        indices.t()])
    name = _helper_name("sparse_allreduce", name, process_set)
    indices_handle = allgather_async(marked, f"{name}.indices", process_set)
    values_handle = allgather_async(coalesced.values().contiguous(), f"{name}.values", process_set)

    def wait():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        shape_rows = indices[:, 0] < 0
        shapes = (-indices[shape_rows] - 1).tolist()
        if any(s != sparse_sizes for s in shapes):
            raise ValueError(f"sparse_allreduce_async('{name}'): every rank must pass the same dense shape: "
                             + ", ".join(f"rank {r} has {s}" for r, s in zip(process_set.ranks, shapes)))
        indices = indices[~shape_rows]
        integer = op == Average and not values.is_floating_point() and not values.is_complex() \
            and values.dtype != torch.bool
        if op == Average and not integer:
            values = values / process_set.size()
        # Check that the received indices lie inside the tensor before anything indexes with them.
        reduced = torch.sparse_coo_tensor(indices.t(), values, tensor.shape, dtype=tensor.dtype, device=tensor.device,
                                          check_invariants=True)
        if integer:  # the ranks' entries add up before the truncating division, as in a dense Average
            reduced = reduced.coalesce()
            reduced = torch.sparse_coo_tensor(reduced.indices(), torch.div(reduced.values(), process_set.size(),
                                                                           rounding_mode="trunc"), tensor.shape)
        return reduced

    wait.handles = (indices_handle, values_handle)  # for whoever must abandon the wait (mpi_ops.abandon)
    return wait
