"""CUDA tensors in horo_torch: the two ways they reach the core.

* Core path (allreduce, grouped allreduce, broadcast): the core reads and writes CUDA memory
  itself. It runs NCCL when every rank of the process set has its own GPU and NCCL loads, and
  stages through its own pinned buffer otherwise (two ranks sharing a GPU); see
  horo_core/src/device/device_executor.h. The core's work waits on an event recorded on the
  caller's current stream, and the handle completes only when that work has finished. Scale
  factors and Average's division run here, as torch ops on the device, after the core is done.
* Staged path (allgather, alltoall, reducescatter, sparse, and every op when the core cannot load
  the CUDA driver): inputs are copied with non_blocking copies on the caller's current stream into
  pinned host buffers that a pool reuses, the core runs on host memory, and results are copied
  back on the same stream. The copies are waited for before the core reads the buffer and before
  synchronize() returns, so the output is valid for every stream and for the host.
"""
import threading
import weakref

import torch

from horo_core import nccl
from horo_core._binding import lib
from horo_core.errors import HoroUnsupportedError
from horo_core.reduce_ops import Average

# Benchmarks set this to False to measure the staged path against the core path on the same data.
CORE_TAKES_CUDA = True

_FLOATING = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


class PinnedPool:
    """Page-locked host buffers, reused across operations. Sizes are rounded up to a power of two
    so that a training loop's repeated shapes find their buffer again."""

    def __init__(self, keep_per_size=4):
        self._free = {}
        self._lock = threading.Lock()
        self._keep = keep_per_size

    def take(self, nbytes):
        size = max(4096, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        return torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def give(self, buffer):
        with self._lock:
            free = self._free.setdefault(buffer.numel(), [])
            if len(free) < self._keep:
                free.append(buffer)


_pool = PinnedPool()


def is_cuda(tensor):
    return tensor.device.type == "cuda"


class Staging:
    """The host side of one operation: pinned buffers taken from the pool, and the CUDA stream
    (the caller's current one at enqueue time) on which every copy of this operation runs."""

    def __init__(self):
        self._buffers = []
        self._streams = {}

    def _stream(self, device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.current_stream(device)
        return self._streams[device]

    def to_host(self, tensor):
        """A contiguous host tensor holding tensor's values; for CUDA, a view of a pinned buffer
        whose copy is in flight until ready() returns."""
        t = tensor.detach()
        if t.device.type == "cpu":
            return t.contiguous()
        if not is_cuda(t):
            return t.cpu().contiguous()
        host = self.host_empty(t.shape, t.dtype)
        with torch.cuda.stream(self._stream(t.device)):
            host.copy_(t, non_blocking=True)
        return host

    def host_empty(self, shape, dtype):
        """An uninitialised host tensor backed by a pooled pinned buffer."""
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buffer = _pool.take(nbytes)
        self._buffers.append(buffer)
        return buffer[:nbytes].view(dtype).view(shape)

    def to_device(self, host, like):
        """A new tensor on like's device with host's values (copy in flight until done())."""
        out = torch.empty(host.shape, dtype=host.dtype, device=like.device)
        self.copy(out, host)
        return out

    def copy(self, target, source):
        """target.copy_(source) on this operation's stream when target is a CUDA tensor."""
        with torch.no_grad():
            if is_cuda(target):
                with torch.cuda.stream(self._stream(target.device)):
                    target.copy_(source, non_blocking=True)
            else:
                target.copy_(source)

    def ready(self):
        """Waits for the copies issued so far (before the core reads the host buffers)."""
        for stream in self._streams.values():
            stream.synchronize()

    def done(self):
        """Waits for the copies back, then returns the buffers to the pool."""
        try:
            self.ready()
        finally:
            self.release()

    def release(self):
        buffers, self._buffers = self._buffers, []
        for b in buffers:
            _pool.give(b)


# The core path ------------------------------------------------------------------------------------

_enabled = weakref.WeakKeyDictionary()  # Runtime -> whether its core takes CUDA tensors


def core_takes(runtime, tensors):
    """Whether the core can run this operation on these tensors in place on the GPU: all of them
    CUDA tensors of one device, and the core's CUDA support loads (tried once per runtime).

    Raises:
        horo_core.nccl.NcclNotFound: HORO_NCCL_LIBRARY names a library that does not load.
    """
    if not CORE_TAKES_CUDA or not tensors or not all(is_cuda(t) for t in tensors):
        return False
    if len({t.device for t in tensors}) != 1:
        return False
    state = _enabled.get(runtime)
    if state is None:
        path, _, _ = nccl.find()
        try:
            runtime.enable_cuda(path)
            state = True
        except HoroUnsupportedError as exc:
            import warnings
            warnings.warn(f"horo_torch: CUDA tensors are staged through host memory by the adapter: {exc}")
            state = False
        _enabled[runtime] = state
    return state


def device_code(tensor):
    return lib.HORO_DEVICE_CUDA_BASE + tensor.device.index if is_cuda(tensor) else lib.HORO_DEVICE_HOST


def ready_event(tensors):
    """An event recorded on the current stream of the tensors' device, after what produced them."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensors[0].device))
    return event


def _scale_(tensor, factor):
    """tensor *= factor in tensor's dtype; integers truncate and saturate, as the host path does."""
    if factor == 1.0 or tensor.dtype == torch.bool:
        return tensor
    if tensor.dtype in _FLOATING:
        return tensor.mul_(factor)
    info = torch.iinfo(tensor.dtype)
    return tensor.copy_((tensor.double() * factor).trunc().clamp(info.min, info.max).to(tensor.dtype))


def prescaled(tensor, factor):
    """The input the core reads: contiguous, multiplied by factor (a new tensor unless factor is 1)."""
    t = tensor.detach().contiguous()
    if factor == 1.0:
        return t
    with torch.no_grad():
        return _scale_(t.clone(), factor)


def postscale_(tensor, op, factor, members):
    """What the core leaves to the adapter on the core path: postscale, and for Average the
    division by the number of members (truncating for integers, as the host path does)."""
    with torch.no_grad():
        if tensor.dtype in _FLOATING:
            return _scale_(tensor, factor / members if op == Average else factor)
        _scale_(tensor, factor)
        if op == Average and tensor.dtype != torch.bool:
            tensor.copy_(torch.div(tensor, members, rounding_mode="trunc"))
        return tensor
