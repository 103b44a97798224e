"""Python-level handles of horo_torch's asynchronous operations: what ``poll()`` and
``synchronize()`` need to finish an operation (its core handles, the tensors to keep alive, how to
build the result, staging buffers to give back), and the handles nobody will synchronize
(``abandon``). The operations themselves are started in horo_torch/mpi_ops.py and the modules it carries.
"""
import collections
import itertools
import os
import threading

from horo_core.basics import at_shutdown
from horo_core.errors import HoroShutdownError
from horo_torch._compile import eager_under_compile


class _Pending:
    """What synchronize() needs: the core handles, the tensors (and CUDA event) to keep alive, how
    to finish, the staging buffers to give back however it ends, and whether finishing reads
    core-owned results (else each handle is waited on and released at once)."""

    __slots__ = ("runtime", "core_handles", "keep", "finish", "staging", "needs_result")

    def __init__(self, runtime, core_handles, keep, finish, staging=None, needs_result=True):
        self.runtime, self.core_handles, self.keep, self.finish = runtime, core_handles, keep, finish
        self.staging = staging
        self.needs_result = needs_result


_handle_map = {}
_handle_ids = itertools.count(1)
_handle_lock = threading.Lock()

# Handles that nobody will synchronize (their owner was collected; see abandon), discarded by a later
# _register or synchronize once their operations complete. A deque: appending takes no lock, so a
# finalizer may do it while this thread holds _handle_lock.
_abandoned = collections.deque()


def _new_lock_in_child():
    # Another thread may have held a lock at the fork; a forked child's synchronize() must raise
    # (horo_core/basics.py: _forget_in_child), not wait for ever.
    global _handle_lock, _settle_lock
    _handle_lock = threading.Lock()
    _settle_lock = threading.RLock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def abandon(handles):
    """Lets go of handles that will never be synchronized, e.g. those of a DistributedOptimizer
    collected between backward() and step(). Their entries (and the tensors they keep) stay until the
    operations complete, since the core may still write into those tensors; they are then discarded,
    without finishing, when a later asynchronous operation starts or a handle is synchronized (every
    training step does both). Safe to call from a finalizer."""
    _abandoned.extend(handles)


def _release_abandoned():
    """Discards the abandoned handles whose operations have completed; never raises (it runs beside
    other operations, which must not fail for it)."""
    for _ in range(len(_abandoned)):
        try:
            handle = _abandoned.popleft()
        except IndexError:  # another thread took the rest
            return
        pending = _handle_map.get(handle)
        if pending is None:
            with _settle_lock:  # settled at a shutdown (perhaps now): nobody's
                _settled.pop(handle, None)
            continue
        try:
            done = all(pending.runtime.poll(h) for h in pending.core_handles)
        except Exception:  # noqa: BLE001 - the runtime is gone: only the entry is left to drop
            done = True
        if not done:
            _abandoned.append(handle)
            continue
        with _handle_lock:
            pending = _handle_map.pop(handle, None)
        if pending is not None:
            _discard(pending)
        else:  # a shutdown's settle() took it meanwhile
            with _settle_lock:
                _settled.pop(handle, None)


def _discard(pending):
    """Releases a completed operation's core handles and staging buffers; its results, and its
    error if it failed, are nobody's."""
    for h in pending.core_handles:
        try:
            pending.runtime.release(h)
        except Exception:  # noqa: BLE001 - after shutdown the handles are gone already
            pass
    if pending.staging is not None:
        try:
            pending.staging.done()
        except Exception:  # noqa: BLE001
            pass


def _register(runtime, core_handles, keep, finish, staging=None, needs_result=True):
    with _handle_lock:
        handle = next(_handle_ids)
        _handle_map[handle] = _Pending(runtime, core_handles, keep, finish, staging, needs_result)
    if _abandoned:  # after the new entry is safe in the map
        _release_abandoned()
    return handle


# Handles whose runtime was shut down before they were synchronized: their outcome, finished at
# shutdown (settle), as a (result, error) pair.
_settled = {}
# Held while settle() runs: a synchronize() or poll() that finds its handle in neither table waits
# for it, as settle() may be finishing that very handle.
_settle_lock = threading.RLock()


def settle(runtime):
    """At shutdown (horo_core.basics.at_shutdown), once runtime has failed what had not completed:
    finishes every handle of runtime still in the map, so that synchronize() afterwards returns a
    completed operation's result, or raises its error (a HoroShutdownError for one cut short), and
    poll() returns True. Horovod's handles outlive shutdown() the same way. Abandoned handles are
    discarded instead."""
    with _settle_lock:
        with _handle_lock:
            mine = [(h, pending) for h, pending in _handle_map.items() if pending.runtime is runtime]
            for h, _ in mine:
                del _handle_map[h]
        abandoned = set(_abandoned)
        settled = 0
        try:
            for handle, pending in mine:
                if handle in abandoned:
                    _discard(pending)
                else:
                    try:
                        _settled[handle] = (_finish(pending), None)
                    except Exception as exc:  # noqa: BLE001 - the operation's error, raised by synchronize()
                        # Without its traceback, which holds this frame and with it every pending here.
                        _settled[handle] = (None, exc.with_traceback(None))
                settled += 1
        finally:
            # Interrupted (a KeyboardInterrupt): what is left can no longer be finished.
            for handle, pending in mine[settled:]:
                _discard(pending)
                if handle not in abandoned:
                    _settled[handle] = (None, HoroShutdownError(
                        "Horo: shutdown() was interrupted before this operation's result was settled"))


at_shutdown(settle)


@eager_under_compile
def poll(handle):
    """Returns True once the operation behind handle has completed (synchronize will not block).

    Args:
        handle: a handle returned by an ``*_async`` function.
    Returns:
        bool.
    Raises:
        ValueError: the handle is unknown.
    """
    pending = _handle_map.get(handle)
    if pending is None:
        with _settle_lock:
            if handle in _settled:
                return True
        raise ValueError(f"unknown handle {handle}")
    # A loop of poll() calls holds this thread's core: each call moves the collectives a step.
    return all(pending.runtime.poll(h, driving=True) for h in pending.core_handles)


@eager_under_compile
def synchronize(handle):
    """Waits (GIL released; a brief spin, then asleep) for an asynchronous operation and returns its result.

    Args:
        handle: a handle returned by an ``*_async`` function.
    Returns:
        The output tensor, a list of tensors for grouped operations, or (output, received_splits)
        for alltoall with splits. None for an unknown handle, as in Horovod. After shutdown(), a
        handle not synchronized before gives what it would have: the result of an operation that
        completed, the error of one that failed or that shutdown() cut short.
    Raises:
        HorovodInternalError (or a subclass such as HoroMismatchError): the collective failed.
    """
    with _handle_lock:
        pending = _handle_map.pop(handle, None)
    if _abandoned:
        _release_abandoned()
    if pending is None:
        with _settle_lock:
            result, error = _settled.pop(handle, (None, None))
        if error is not None:
            raise error
        return result
    return _finish(pending)


def _finish(pending):
    """Waits for pending's operations and returns its result; raises the operation's error."""
    rt = pending.runtime
    # Outputs the caller gave need no result: each handle is waited on and released in one call.
    results = [] if pending.needs_result else None
    error = None
    for h in pending.core_handles:
        try:
            if results is None:
                rt.wait_release(h)
            else:
                rt.wait(h)
                results.append(rt.result(h))
        except Exception as exc:  # keep waiting so that no buffer is freed while still in use
            error = error or exc
    try:
        if error is not None:
            raise error
        return pending.finish(rt, results)
    finally:
        try:
            if pending.staging is not None:
                pending.staging.done()
        finally:
            if results is not None:
                for h in pending.core_handles:
                    try:
                        rt.release(h)
                    except Exception:  # never mask the operation's own error; after shutdown handles are gone
                        pass
