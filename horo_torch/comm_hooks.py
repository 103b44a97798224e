"""Gradient communication hooks for ``horo_torch.DistributedDataParallel``, in the spirit of DDP's.

A hook is ``hook(state, bucket) -> future``: ``bucket`` is a :class:`GradBucket` (the flat buffer of
one bucket's gradients, in bucket order), and the future's ``wait()`` returns a flat tensor with as
many elements as the buffer: the values written back into the gradients. ``state`` is whatever was
given to ``register_comm_hook``; the hooks here read it as the process set to reduce over (None:
the wrapper's own set), as DDP's default hooks read it as the process group.

Buckets are launched in bucket order on every rank, so a hook may issue unnamed collectives; the
hooks here use ``bucket.name()`` so that their operations are recognisable in timelines and logs.
A hook may return a ``torch.futures.Future`` that is already complete, or a :class:`HandleFuture`
around a Horo handle.
"""
import torch

from horo_torch.mpi_ops import Average, Sum, allreduce_async_, poll, synchronize


class GradBucket:
    """One bucket of gradients, as handed to a communication hook (DDP's ``dist.GradBucket``).

    Args:
        index: the bucket's position in the launch order.
        name: a name unique to this bucket of this wrapper; the same on every rank.
        buffer: flat tensor holding the gradients of ``parameters`` one after another.
        parameters: the parameters whose gradients the buffer holds, in buffer order.
        is_last: whether this is the last bucket launched in an iteration.
        process_set: the wrapper's process set.
    """

    def __init__(self, index, name, buffer, parameters, is_last, process_set):
        self._index, self._name, self._buffer = index, name, buffer
        self._parameters, self._is_last, self._process_set = list(parameters), is_last, process_set

    def index(self):
        """Returns the bucket's index (0 is launched first)."""
        return self._index

    def name(self):
        """Returns a collective name unique to this bucket, identical on every rank."""
        return self._name

    def buffer(self):
        """Returns the flat buffer of gradients (complex gradients as their real view: real and
        imaginary parts side by side, as torch.distributed sends them)."""
        return self._buffer

    def set_buffer(self, buffer):
        """Replaces the flat buffer (same number of elements).

        Raises:
            ValueError: the number of elements differs.
        """
        if buffer.numel() != self._buffer.numel():
            raise ValueError(f"bucket {self._name}: new buffer has {buffer.numel()} elements, "
                             f"the bucket holds {self._buffer.numel()}")
        self._buffer = buffer

    def parameters(self):
        """Returns the parameters of the bucket, in buffer order."""
        return list(self._parameters)

    def gradients(self):
        """Returns views of the buffer shaped like each parameter, in buffer order."""
        views, offset = [], 0
        buffer = self._buffer
        if self._parameters and self._parameters[0].is_complex() and not buffer.is_complex():
            try:  # views of the buffer, as for real gradients
                buffer = torch.view_as_complex(buffer.reshape(-1, 2))
            except RuntimeError:  # a buffer set_buffer gave in another dtype or at an odd offset
                from horo_torch._ddp_gradients import as_complex
                buffer = as_complex(buffer, self._parameters[0])
        for p in self._parameters:
            views.append(buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def is_last(self):
        """Returns True for the last bucket of an iteration."""
        return self._is_last

    def process_set(self):
        """Returns the process set the wrapper reduces over."""
        return self._process_set


class HandleFuture:
    """A future over a Horo handle, used as a ``torch.futures.Future``: ``then(callback)`` calls
    ``callback(future)`` once the value is known (the callback reads ``future.value()``), ``wait()``
    and ``value()`` synchronize and return the result after the ``then`` steps, in order.

    Args:
        handle: a handle from an ``*_async`` collective whose result is one tensor.
    """

    def __init__(self, handle, steps=()):
        self._handle, self._steps = handle, tuple(steps)
        self._done, self._value = False, None

    def then(self, callback):
        """Returns a future whose value is ``callback(completed future)``, as torch's Future.then;
        only one future of a chain may be waited on.

        Args:
            callback: a function of a completed future (its ``value()`` is this future's value).
        Returns:
            HandleFuture.
        """
        return HandleFuture(self._handle, self._steps + (callback,))

    def done(self):
        """Returns whether the collective has completed (then wait() and value() do not block)."""
        return self._done or poll(self._handle)

    def wait(self):
        """Waits for the collective and returns the (transformed) result; repeated calls return it again.

        Returns:
            torch.Tensor.
        Raises:
            HorovodInternalError: the collective failed.
        """
        if not self._done:
            value = synchronize(self._handle)
            for callback in self._steps:
                completed = torch.futures.Future()
                completed.set_result(value)
                value = callback(completed)
            self._value, self._done = value, True
        return self._value

    def value(self):
        """The result, as wait() returns it."""
        return self.wait()


def _process_set(state, bucket):
    return bucket.process_set() if state is None else state


def allreduce_hook(state, bucket):
    """Averages the bucket across the ranks (what the wrapper does without a hook).

    Args:
        state: the process set to reduce over, or None for the wrapper's own.
        bucket: the GradBucket.
    Returns:
        HandleFuture yielding the averaged flat buffer.
    """
    handle = allreduce_async_(bucket.buffer(), name=bucket.name(), op=Average,
                              process_set=_process_set(state, bucket))
    return HandleFuture(handle)


def _cast_hook(wire_dtype, state, bucket):
    buffer = bucket.buffer()
    if not buffer.dtype.is_floating_point or buffer.dtype == wire_dtype:
        return allreduce_hook(state, bucket)
    process_set = _process_set(state, bucket)
    # Divide before compressing, as DDP does, so that the sum cannot overflow the narrow type.
    compressed = (buffer / process_set.size()).to(wire_dtype)
    handle = allreduce_async_(compressed, name=bucket.name(), op=Sum, process_set=process_set)
    return HandleFuture(handle).then(lambda fut: fut.value().to(buffer.dtype))


def fp16_compress_hook(state, bucket):
    """Sends the bucket as float16 (half the bytes) and averages it; the result is cast back.

    Gradients beyond float16's range (+-65504) overflow; use bf16_compress_hook for those.

    Args:
        state: the process set to reduce over, or None for the wrapper's own.
        bucket: the GradBucket.
    Returns:
        HandleFuture yielding the averaged buffer in the buffer's dtype.
    """
    return _cast_hook(torch.float16, state, bucket)


def bf16_compress_hook(state, bucket):
    """Sends the bucket as bfloat16 (half the bytes, float32's range, 8 mantissa bits) and averages it.

    Args:
        state: the process set to reduce over, or None for the wrapper's own.
        bucket: the GradBucket.
    Returns:
        HandleFuture yielding the averaged buffer in the buffer's dtype.
    """
    return _cast_hook(torch.bfloat16, state, bucket)
