"""The core reads a torch tensor's dtype, device, shape, contiguity and data pointer itself
(horo_tensor_reader_t, through the C interface libtorch exports for ahead-of-time compiled code),
so that a repeated synchronous allreduce crosses from Python with the tensor's ``_cdata`` alone.

Reading those five facts in Python is five calls into torch's Python layer, about 0.6 us on an idle
core and a quarter of a 4-byte allreduce's latency with 4 ranks on 2 cores, where every call runs
with cold caches (docs/benchmarks.md, "The core reads the tensor"). The core makes the same reads
in a few dozen instructions.

The reader is used only once it has been checked in this process: torch's own handle of a probe
tensor (``torch._C._aoti.unsafe_alloc_void_ptr_from_tensor``) must point at a word holding the
tensor's ``_cdata``, which is how the core makes its handles, and the core's reading of a probe of
every dtype Horo takes must agree with what torch says in Python. Where either fails (a torch
without these functions, or one whose layout differs), the adapters read tensors in Python as
before. ``facts_of`` checks each tensor the same way before a run is bound to its reading.
"""
import ctypes
import os

import torch

from horo_core._binding import ffi, lib

# The types whose _cdata is the TensorImpl itself: a subclass may answer attribute reads through
# __torch_function__, so any other type takes the adapters' general path.
READABLE = (torch.Tensor, torch.nn.Parameter)

# "reader": the horo_tensor_reader_t* (None: unusable here); "dtypes": torch dtype -> the core's reading of it;
# "cpu": the reading of the host device.
_state = {}


def reader():
    """The core's reader of torch tensors, or None where it cannot be used (see the module's
    docstring). Opened and checked at the first call."""
    if "reader" not in _state:
        _state["reader"] = _open()
    return _state["reader"]


def _open():
    try:
        if not _handle_is_cdata_cell():
            return None
    except (AttributeError, TypeError, ValueError, RuntimeError):  # a torch without these functions
        return None
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    out = ffi.new("horo_tensor_reader_t**")
    if lib.horo_tensor_reader_open(path.encode(), out) != lib.HORO_OK:
        return None
    opened = ffi.gc(out[0], lib.horo_tensor_reader_free)
    from horo_torch._calls import _TORCH_DTYPES  # noqa: PLC0415 (_calls imports this module)
    codes, devices = {}, set()
    for dtype in _TORCH_DTYPES:
        probe = torch.empty((2, 3), dtype=dtype)
        facts = _read(opened, probe)
        if facts is None or not _agrees(facts, probe) or facts.dtype in codes.values():
            return None
        codes[dtype] = facts.dtype
        devices.add(facts.device_type)
    if len(devices) != 1:
        return None
    _state["dtypes"], _state["cpu"] = codes, devices.pop()
    return opened


def _handle_is_cdata_cell():
    """Whether torch's handle of a tensor (an at::Tensor's address) points at the tensor's _cdata."""
    probe = torch.empty(1)
    capsule = torch._C._aoti.unsafe_alloc_void_ptr_from_tensor(probe)
    try:
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        handle = get_pointer(capsule, None)
        return handle is not None and ctypes.c_void_p.from_address(handle).value == probe._cdata
    finally:
        torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(capsule)  # frees torch's handle


def _read(opened, tensor):
    facts = ffi.new("horo_tensor_facts_t*")
    if lib.horo_tensor_reader_read(opened, tensor._cdata, facts) != lib.HORO_OK:
        return None
    return facts


def _agrees(facts, tensor):
    return (facts.ndim == tensor.dim() and list(facts.shape[0:facts.ndim]) == list(tensor.shape)
            and facts.data == tensor.data_ptr() and facts.contiguous == int(tensor.is_contiguous()))


def facts_of(tensor):
    """The core's reading of tensor (a dense contiguous host tensor of a dtype Horo takes), to bind
    a run to (horo_run_read's expected), or None when the reader is unusable or disagrees with torch."""
    opened = reader()
    if opened is None or type(tensor) not in READABLE:
        return None
    facts = _read(opened, tensor)
    if (facts is None or facts.dtype != _state["dtypes"].get(tensor.dtype) or facts.device_type != _state["cpu"]
            or facts.contiguous != 1 or not _agrees(facts, tensor)):
        return None
    return facts
