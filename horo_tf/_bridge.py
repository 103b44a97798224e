"""How a TensorFlow tensor reaches Horo's core: NumPy views, one ``tf.numpy_function`` per collective.

Eagerly, a collective reads its inputs as NumPy arrays (a view of the tensor's host buffer where
TensorFlow allows it), hands ``(pointer, dtype, shape)`` to the core, and wraps the result in a
tensor. Inside a ``tf.function`` the same body runs in one ``tf.numpy_function`` per collective
(a grouped allreduce of all gradients is one call), so nothing is compiled against TensorFlow.
``numpy_function`` rather than ``py_function``: it passes the inputs as arrays over the tensors'
buffers and takes the outputs back as arrays, without building an EagerTensor for each, which
saves about 20 us per tensor on every step.

Two rules keep ranks in step in graphs:

* Names are fixed when the graph is traced, so every run of a graph submits the same names on
  every rank. An unnamed collective is named after its input tensor in the graph (as Horovod names
  ``HorovodAllreduce_<tensor name>``), made unique within the graph: a rank that traces a function
  again (a smaller last batch on one rank only) then still submits the names the others do. Eagerly,
  the unnamed collectives of one kind share one name (``auto_name``), as Horovod's eager ops do.
* A ``numpy_function`` blocks the executor thread that runs it, so the collectives of one graph are
  chained by control dependencies (``_chain``: through a whole ``tf.function``, and in a TF1 graph
  among the collectives that need the same feeds and input pipelines).

XLA cannot compile a ``numpy_function``; tracing a collective inside a ``jit_compile=True`` function
raises a ``HoroUnsupportedError`` that says how to turn XLA off.
"""
import collections
import math
import re
import sys
import threading

import numpy as np
import tensorflow as tf

from horo_core import basics, dtypes
from horo_core._binding import lib
from horo_core.errors import HoroError, HoroInvalidArgument, HoroUnsupportedError
from horo_core.runtime import TensorSpec, cache_lookup, cache_store, prepare_run
from horo_tf import _chain, errors

try:  # 0 when no GradientTape or forward accumulator on this thread watches any of the tensors.
    from tensorflow.python.ops.gradients_util import PossibleTapeGradientTypes as _possible_gradient_types
except ImportError:  # pragma: no cover - TensorFlow moved it: always assume a tape may record
    def _possible_gradient_types(tensors):
        return 1

try:  # The XLA context that tf.function(jit_compile=True) enters while it traces.
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla_context
except ImportError:  # pragma: no cover - TensorFlow moved it; the XLA compiler will reject the op instead
    def _in_xla_context(graph):
        return False

_TF_DTYPES = {
    tf.uint8: dtypes.UINT8, tf.int8: dtypes.INT8, tf.int16: dtypes.INT16, tf.int32: dtypes.INT32,
    tf.int64: dtypes.INT64, tf.float16: dtypes.FLOAT16, tf.bfloat16: dtypes.BFLOAT16, tf.float32: dtypes.FLOAT32,
    tf.float64: dtypes.FLOAT64, tf.bool: dtypes.BOOL, tf.uint16: dtypes.UINT16,
}

XLA_MESSAGE = ("Horo's TensorFlow collectives run as tf.numpy_function, which XLA cannot compile, and this code "
               "is being compiled with XLA (jit_compile=True). Turn XLA off for the function that calls them: "
               "model.compile(..., jit_compile=False) for Keras, tf.function(..., jit_compile=False) otherwise "
               "(or unset TF_XLA_FLAGS=--tf_xla_auto_jit).")


_ALIGNMENT = 64  # TensorFlow takes a NumPy buffer aligned to this as a tensor's own instead of copying it
_ALIGN_FROM_BYTES = 1 << 16  # below, the copy costs less than the longer allocation


def host_empty(shape, dtype):
    """An uninitialized array for a collective's result; from 64 KiB on 64-byte aligned, so that the
    output tensor (of a numpy_function, or eagerly) takes its buffer instead of a copy (NumPy
    aligns to 16 bytes only: a 16 MB result cost one more 16 MB copy), and taken from buffers kept
    for reuse (_ResultBuffers)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize  # (np.prod would add 3 us to every small call)
    if nbytes < _ALIGN_FROM_BYTES:
        return np.empty(shape, dtype)
    raw = _result_buffers.take(nbytes + _ALIGNMENT)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _references(buffers, i):
    return sys.getrefcount(buffers[i])


class _ResultBuffers:
    """Buffers for large results, reused once nothing refers to them any more.

    A result's tensor owns its buffer (host_empty), and each step's results are new tensors. Freshly
    allocated, every page of one is a page fault when the core first writes it: glibc hands large
    blocks back to the system when they are freed and maps new ones, so a 16 MB grouped allreduce
    of a TF1 step took 4,000 faults and several milliseconds more each step. A kept buffer is free
    again when only this pool refers to it: a tensor or array using it refers to it (an array view's
    base is the buffer), so its reference count says so.

    Bounds, so that results of changing sizes (allgathers of varying rows) cost neither memory nor
    time: a size is kept from the second time it is asked for; a take looks at most PROBES buffers
    of its size, from where the last one was found (results of a step are freed in the order they
    were made); and at most LIMIT bytes are kept, room being made by dropping free buffers of the
    sizes used longest ago. Past that, a result gets a buffer of its own, as before.
    """

    LIMIT = 512 << 20
    PROBES = 16
    SIZES_SEEN = 256  # sizes asked for once, remembered to keep them the second time
    # What _references counts for a buffer that only its list refers to (measured, not assumed: the
    # count of the call's own references differs between Python versions).
    ONLY_LISTED = _references([np.empty(0, np.uint8)], 0)

    def __init__(self):
        self._lock = threading.Lock()  # numpy_functions of a graph may run on several threads
        self._by_size = collections.OrderedDict()  # nbytes -> [buffers, where to look first]; oldest use first
        self._seen = collections.OrderedDict()
        self._kept = 0

    def take(self, nbytes):
        """A uint8 array of nbytes that nothing else refers to."""
        with self._lock:
            entry = self._by_size.get(nbytes)
            if entry is None:
                if nbytes not in self._seen:  # the first time: a size that may never recur
                    self._seen[nbytes] = None
                    if len(self._seen) > self.SIZES_SEEN:
                        self._seen.popitem(last=False)
                    return np.empty(nbytes, np.uint8)
                del self._seen[nbytes]
                entry = self._by_size[nbytes] = [[], 0]
            self._by_size.move_to_end(nbytes)
            buffers, first = entry
            for k in range(min(len(buffers), self.PROBES)):
                i = (first + k) % len(buffers)
                if _references(buffers, i) == self.ONLY_LISTED:
                    entry[1] = i + 1
                    return buffers[i]
            raw = np.empty(nbytes, np.uint8)
            if self._make_room(nbytes):
                buffers.append(raw)
                self._kept += nbytes
            return raw

    def _make_room(self, nbytes):
        """Whether nbytes more may be kept, after dropping free buffers of the sizes used longest ago."""
        for size in list(self._by_size):
            if self._kept + nbytes <= self.LIMIT:
                return True
            buffers = self._by_size[size][0]
            i = 0
            while i < len(buffers) and self._kept + nbytes > self.LIMIT:
                if _references(buffers, i) == self.ONLY_LISTED:
                    del buffers[i]
                    self._kept -= size
                else:
                    i += 1
            if not buffers and size != nbytes:
                del self._by_size[size]
        return self._kept + nbytes <= self.LIMIT


_result_buffers = _ResultBuffers()


class Unsupported:
    """In place of the dtype code of a tensor whose dtype the core has none for: the collective then
    fails on every member of the set when it runs (execute), instead of on this rank alone, which
    would leave the others waiting for the tensor."""

    __slots__ = ("reason",)

    def __init__(self, reason):
        self.reason = reason


def dtype_code(dtype, name):
    """The core dtype code of a TensorFlow dtype, or an Unsupported that says why there is none."""
    try:
        return _TF_DTYPES[tf.as_dtype(dtype)]
    except (KeyError, TypeError):
        supported = ", ".join(d.name for d in _TF_DTYPES)
        return Unsupported(f"passed dtype {getattr(dtype, 'name', dtype)} for '{name}', which is not supported "
                           f"(supported: {supported})")


def process_set_id(process_set):
    """The core id of process_set; a ProcessSet that init/add_process_set never registered has none.
    In a graph an id that names no registered set is refused while the graph is built (as
    Horovod's ValueError), not when it runs: there it would surface as TensorFlow's error type, and
    a later collective that waits on this one (``_chain``) would fail with it too."""
    if process_set.process_set_id is None:
        raise HoroInvalidArgument(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
                                  "hvd.add_process_set() first")
    if not tf.executing_eagerly() and basics.is_initialized() and \
            not basics.process_set_registered(process_set.process_set_id):
        raise HoroInvalidArgument(f"process set id {process_set.process_set_id} ({process_set}) names no registered "
                                  f"process set")
    return process_set.process_set_id


def op_name(kind, name, process_set, ignore_name_scope=False, tensors=()):
    """The name ranks match this operation by: ``kind.name`` (under the current name scope unless
    ignore_name_scope); when name is None, auto_name's."""
    if name is None:
        return auto_name(kind, process_set_id(process_set), tensors)
    scope = "" if ignore_name_scope else tf.get_current_name_scope()
    return f"{kind}.{scope}/{name}" if scope else f"{kind}.{name}"


def auto_name(kind, set_id, tensors=()):
    """A name for an unnamed operation on tensors: while a tf.function traces, ``kind.<functions
    traced>:<first tensor's name>[..<last tensor's name>]``, unique within the graph (and the same
    in every trace of the same code); eagerly ``kind.noname``, the same for every call.

    An eager call runs to its end before the next one starts, so one name per kind is enough, and
    it is what Horovod does (there every unnamed eager op of a kind carries the kernel's node name):
    ranks that made different numbers of unnamed calls still meet at the next one, as when a rank
    that ran out of data joined while the others went on logging an unnamed metric allreduce."""
    if tf.executing_eagerly():
        return f"{kind}.noname"
    if tensors:
        # Graph tensors, tf.Variables and Keras variables have names; Python and NumPy values get
        # those of the constants they become (a call-order counter would differ after a retrace).
        names = [getattr(t.values if isinstance(t, tf.IndexedSlices) else t, "name", None) for t in tensors]
        names = [n if isinstance(n, str) and n else _constant_name(t) for n, t in zip(names, tensors)]
        if all(names):
            graph = tf.compat.v1.get_default_graph()
            base = f"{kind}.{_function_path(graph)}:{names[0]}" + (f"..{names[-1]}" if len(names) > 1 else "")
            return graph.unique_name(base)
    return basics.auto_name(kind, set_id)


def _constant_name(value):
    """The name of the graph constant a Python or NumPy value becomes, or None: for other values too,
    as an eager tensor captured by a tf.function, whose placeholder takes a process-wide number."""
    if not isinstance(value, (bool, int, float, list, tuple, np.ndarray, np.generic)):
        return None
    try:
        return tf.convert_to_tensor(value).name
    except (TypeError, ValueError):
        return None


def _function_path(graph):
    """The names of the tf.functions being traced, outermost first ("outer/inner"): tensor names
    restart in every function's graph, so an inner function's tensors may be named like the outer
    one's, and its collectives may run beside them. (Branches of tf.cond and loop bodies carry their
    scope in their tensor names instead; their graph names hold process-wide counters.)"""
    path = []
    while graph is not None:
        if type(graph).__name__ == "FuncGraph":
            path.append(_without_counters(graph.name))
        graph = getattr(graph, "outer_graph", None)
    return "/".join(reversed(path))


_GENERATED = re.compile(r"__(backward|forward|inference)_(.*)_\d+")


def _without_counters(name):
    """The name of a function's graph without the process-wide counters of the graphs TensorFlow
    derives from it for a tape ("__backward_f_166", "__backward___backward_f_51_78" for a second
    order): those differ between ranks as soon as one of them traced any other function (a
    rank-0-only summary or checkpoint). Two such graphs of one function are then named alike, as
    its forward graphs already are."""
    derived = _GENERATED.fullmatch(name)
    return f"__{derived[1]}_{_without_counters(derived[2])}" if derived else name


def to_numpy(tensor):
    """A C-contiguous NumPy array with tensor's values (a view of the tensor's buffer when possible)."""
    return np.asarray(tensor.numpy(), order="C")


_RUN_OPS = (lib.HORO_ALLREDUCE, lib.HORO_BROADCAST)  # what Runtime.run takes (its output given)
_SIZED_OPS = (lib.HORO_ALLGATHER, lib.HORO_ALLTOALL, lib.HORO_REDUCESCATTER)  # the core sizes their results
# Per (operation, name, set, dtype, shape, options) of one array: the core's description, made once,
# and the shape of the last result, the next call's output guess (horo_tensor_t.output_bytes): a loop
# of the same allgather, alltoall or reducescatter then gets its result written straight into a new
# array, in one call into the core (Runtime.run_result_prepared), as horo_torch's do.
_sized_runs = {}
_SIZED_RUNS_LIMIT = 4096


def execute(op_type, names, arrays, codes, outputs, set_id, **options):
    """Runs one core operation over NumPy arrays and waits for it.

    Args:
        op_type: a ``lib.HORO_*`` operation code.
        names: one name per array (several arrays form one group).
        arrays: C-contiguous input arrays.
        codes: the core dtype code of each array, or an Unsupported (the call then fails on every member).
        outputs: per array, a preallocated output array, or None when the core allocates the result.
        set_id: the process set id.
        **options: reduce_op, prescale_factor, postscale_factor, root_rank, splits.
    Returns:
        (outputs, results): the output arrays (read from the core where it allocated them) and the
        core's Result of every member (received splits, join value); no results for one allreduce
        or broadcast whose output was given (it has none to report).
    Raises:
        HorovodInternalError (or a subclass; also a tf.errors.OpError, horo_tf/errors.py): the
            collective failed.
    """
    try:
        for code in codes:
            if isinstance(code, Unsupported):  # every member fails, with this rank's reason
                basics.runtime().refuse(op_type, names, set_id, code.reason)
        return _execute(op_type, names, arrays, codes, outputs, set_id, **options)
    except HoroError as error:  # as a TensorFlow error too (horo_tf/errors.py)
        raise errors.converted(error) from None


def _execute(op_type, names, arrays, codes, outputs, set_id, **options):
    rt = basics.runtime()
    if len(arrays) == 1 and outputs[0] is not None and op_type in _RUN_OPS:
        # One tensor whose output is given: one synchronous call into the core (horo_run), with no
        # handle to wait on, read and release.
        rt.run(op_type, names[0], arrays[0].ctypes.data, outputs[0].ctypes.data, codes[0], tuple(arrays[0].shape),
               set_id, **options)
        return list(outputs), []
    if len(arrays) == 1 and outputs[0] is None and op_type in _SIZED_OPS:
        return _run_sized(rt, op_type, names[0], arrays[0], codes[0], set_id, options)
    specs = [TensorSpec(n, a.ctypes.data, 0 if o is None else o.ctypes.data, c, tuple(a.shape))
             for n, a, c, o in zip(names, arrays, codes, outputs)]
    # This thread waits at once, and its wait runs the negotiation (no background-thread hand-off).
    handles = rt.enqueue(op_type, specs, process_set_id=set_id, caller_waits=True, **options)
    outs, results, error = list(outputs), [], None
    try:
        for i, h in enumerate(handles):
            try:
                rt.wait(h)
                result = rt.result(h)
            except Exception as exc:  # keep waiting: no input buffer may be freed while still in use
                error = error or exc
                continue
            results.append(result)
            if i < len(outs) and outs[i] is None:
                outs[i] = host_empty(result.shape, arrays[i].dtype)
                rt.copy_result(result, outs[i].ctypes.data)
    finally:
        for h in handles:
            rt.release(h)
    if error is not None:
        raise error
    return outs, results


def _run_sized(rt, op_type, name, array, code, set_id, options):
    """_execute of one allgather, alltoall or reducescatter: ([output], [its Result])."""
    splits = options.get("splits")
    key = (op_type, name, set_id, code, array.shape, options.get("reduce_op"), options.get("prescale_factor"),
           options.get("postscale_factor"), None if splits is None else tuple(splits))
    key, entry = cache_lookup(_sized_runs, key)  # key None: an option given as an array or a tf.Tensor
    if entry is None:
        entry = [prepare_run(op_type, name, code, tuple(array.shape), set_id, runtime=rt, **options), None]
        # A call-order name (in a graph, of Python values) is never reused.
        cache_store(_sized_runs, None if basics.is_auto_name(name) else key, entry, _SIZED_RUNS_LIMIT)
    prepared, shape = entry
    out = None if shape is None else host_empty(shape, array.dtype)
    handle, r = rt.run_result_prepared(prepared, array.ctypes.data, 0 if out is None else out.ctypes.data,
                                       0 if out is None else out.nbytes)
    try:
        result = rt.result_of(r)
        # handle 0 with bytes: written into out, which has the result's bytes and so its shape.
        if handle != 0 or not result.nbytes:
            if out is None or result.nbytes != out.nbytes:  # the core's buffer: copy it out
                out = host_empty(result.shape, array.dtype)
                rt.copy_result(result, out.ctypes.data)
            else:  # the same bytes in other rows (or none at all)
                out = out.reshape(result.shape)
    finally:
        if handle:
            rt.release(handle)
    entry[1] = result.shape
    return [out], [result]


def no_gradient_needed(tensors):
    """True when executing eagerly and no tape (nor forward accumulator) watches any of tensors: a
    collective over them then needs no ``tf.custom_gradient`` wrapper, whose set-up costs far more
    than a small collective (about 100 of the 130-160 us of a 4-byte allreduce on one rank). In a
    graph, ``tf.gradients`` may differentiate it later without a tape, so graphs always get it."""
    return tf.executing_eagerly() and _possible_gradient_types(list(tensors)) == 0


def check_not_xla():
    """Raises HoroUnsupportedError when the code being traced will be compiled by XLA."""
    if not tf.executing_eagerly() and _in_xla_context(tf.compat.v1.get_default_graph()):
        raise HoroUnsupportedError(XLA_MESSAGE)


def call(body, inputs, touts, shapes, local=False):
    """Runs body on the NumPy values of inputs, eagerly or as one numpy_function of the current graph.

    Args:
        body: ``body(*arrays) -> list of arrays``, one per entry of touts.
        inputs: tensors (anything ``tf.convert_to_tensor`` accepts).
        touts: the dtype of every output.
        shapes: the static shape of every output (None or partially known dimensions allowed).
        local: body involves no other rank (a topology query): it waits on no collective (``_chain``).
    Returns:
        A list of tensors.
    Raises:
        HoroUnsupportedError: called while tracing for XLA.
    """
    inputs = [t if isinstance(t, tf.Tensor) else tf.convert_to_tensor(t) for t in inputs]
    if tf.executing_eagerly():
        outs = body(*[to_numpy(t) for t in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, touts)]
    check_not_xla()

    def run(*arrays):  # numpy_function hands over host buffers as arrays, without an EagerTensor each
        return body(*[np.asarray(a, order="C") for a in arrays])

    def build():
        outs = tf.numpy_function(run, inputs, list(touts), stateful=True)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    outs = build() if local else _chain.link(tf.compat.v1.get_default_graph(), inputs, build)
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return outs
