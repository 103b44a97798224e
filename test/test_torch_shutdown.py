"""Handles that outlive ``shutdown()``: the corners of settling them (horo_torch/_handles.py's
``settle``) on 2 real processes. The plain case, on 1-5 ranks, is the group
``handles_left_at_shutdown`` of test_torch_ops.py."""
import torch

import horo_runner


def _shutdown_settling_job():
    """Runs on every rank: the corners of settling handles at shutdown. Returns a list of failures."""
    import threading

    import horo_torch as hvd
    from horo_core import basics
    from horo_torch import _handles

    failures = []
    # A thread that synchronizes a completed handle while shutdown() settles it gets its result.
    hvd.init()
    n = hvd.size()
    handles = [hvd.allgather_async(torch.ones(1_000_000), name=f"settle.{i}") for i in range(4)]
    while not all(hvd.poll(h) for h in handles):
        pass
    got = {}

    def synchronize_while_settled():
        while handles[-1] in _handles._handle_map:  # until settle() takes it
            pass
        got["result"] = hvd.synchronize(handles[-1])

    thread = threading.Thread(target=synchronize_while_settled)
    thread.start()
    hvd.barrier()
    hvd.shutdown()
    thread.join(60)
    result = got.get("result")
    if result is None or tuple(result.shape) != (1_000_000 * n,):
        failures.append(f"synchronize during the settling gave {result if result is None else tuple(result.shape)}")
    # A settled handle abandoned afterwards (an optimizer collected after shutdown) is let go by
    # the next operation, with its tensors.
    abandoned = handles[0]
    hvd.mpi_ops.abandon([abandoned])
    hvd.init()
    hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="settle.next"))
    if abandoned in _handles._settled:
        failures.append("an abandoned settled handle was kept")
    # A shutdown hook that raises stops neither the shutdown nor the other hooks.
    def failing_hook(rt):
        raise RuntimeError("a failing hook")

    basics._shutdown_hooks.insert(0, failing_hook)
    try:
        h = hvd.allreduce_async(torch.ones(2), name="settle.after_hook", op=hvd.Sum)
        while not hvd.poll(h):
            pass
        hvd.shutdown()
    except Exception as exc:  # noqa: BLE001 - reported
        failures.append(f"shutdown raised {exc!r}")
    finally:
        basics._shutdown_hooks.remove(failing_hook)
    if hvd.is_initialized():
        failures.append("still initialized after shutdown()")
    try:
        value = hvd.synchronize(h)
        if value is None or value.tolist() != [float(n)] * 2:
            failures.append(f"synchronize after the failing hook gave {value}")
    except Exception as exc:  # noqa: BLE001 - reported
        failures.append(f"synchronize after the failing hook raised {exc!r}")
    failures += _shutdown_settling_corners(hvd, basics, _handles)
    return failures


def _shutdown_settling_corners(hvd, basics, _handles):
    """The corners a second review found: a settled error kept every tensor of its shutdown alive; a
    child forked during shutdown() still reached the rank's runtime; a Ctrl-C in the settling left
    handles whose synchronize() returned None; a core-owned result copied after another thread's
    shutdown() read freed memory. Returns a list of failures."""
    import os
    import traceback

    failures = []
    hvd.init()
    r = hvd.rank()
    cut_short = hvd.allreduce_async(torch.ones(2), name=f"corner.rank{r}")  # never matched
    gathered = hvd.allgather_async(torch.ones(3), name="corner.gather")
    while not hvd.poll(gathered):
        pass
    pending = _handles._handle_map[gathered]
    result = pending.runtime.result(pending.core_handles[0])  # core-owned, read while the runtime is up
    runtime = pending.runtime
    forked = []

    def fork_during_shutdown(rt):
        pid = os.fork()
        if pid == 0:  # the child: its inherited runtime must refuse, not reach the rank's core
            try:
                rt.stats()
                code = 1
            except hvd.HoroShutdownError:
                code = 0
            except BaseException:  # noqa: BLE001
                code = 2
            os._exit(code)
        forked.append(pid)

    basics._shutdown_hooks.insert(0, fork_during_shutdown)
    try:
        hvd.shutdown()
    finally:
        basics._shutdown_hooks.remove(fork_during_shutdown)
    for pid in forked:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            failures.append(f"a child forked during shutdown(): exit code {os.waitstatus_to_exitcode(status)}")
    error = _handles._settled[cut_short][1]
    frames = [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)]
    if "settle" in frames:  # whose locals hold every operation of that shutdown, tensors included
        failures.append(f"a settled error holds the settling's frame: {frames}")
    try:
        hvd.synchronize(cut_short)
        failures.append("synchronize of the cut-short corner handle returned")
    except hvd.HorovodInternalError:
        pass
    try:
        out = torch.empty(result.nbytes // 4)
        runtime.copy_result(result, out.data_ptr())
        failures.append("copy_result after the runtime was destroyed returned")
    except hvd.HoroShutdownError:
        pass
    hvd.synchronize(gathered)
    # Ctrl-C in the middle of the settling.
    hvd.init()
    handles = [hvd.allreduce_async(torch.ones(2), name=f"corner.interrupted.{i}") for i in range(3)]
    while not all(hvd.poll(h) for h in handles):
        pass
    finish, calls = _handles._finish, []

    def finish_interrupted(p):
        calls.append(p)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return finish(p)

    _handles._finish = finish_interrupted
    try:
        hvd.shutdown()
        failures.append("the interrupted shutdown() did not raise")
    except KeyboardInterrupt:
        pass
    finally:
        _handles._finish = finish
    if hvd.is_initialized():
        failures.append("initialized after an interrupted shutdown()")
    outcomes = []
    for h in handles:
        try:
            outcomes.append(None if hvd.synchronize(h) is None else "result")
        except hvd.HoroShutdownError:
            outcomes.append("HoroShutdownError")
    if outcomes != ["result", "HoroShutdownError", "HoroShutdownError"]:
        failures.append(f"after an interrupted settling, synchronize gave {outcomes}")
    hvd.init()  # and the job goes on
    if hvd.allreduce(torch.ones(1), name="corner.after", op=hvd.Sum).item() != hvd.size():
        failures.append("the allreduce after an interrupted shutdown() is wrong")
    hvd.shutdown()
    return failures


def test_handles_settled_at_shutdown_under_threads_abandon_and_failing_hooks():
    """synchronize() from another thread while shutdown() settles the handle returns its result (it
    returned None when it came between the settling's two steps); a settled handle that is
    abandoned is let go; a shutdown hook that raises is logged, and the shutdown completes. And the
    corners of _shutdown_settling_corners."""
    reports = horo_runner.run(_shutdown_settling_job, num_proc=2, env={"HORO_PEER_TIMEOUT_SECONDS": "60"})
    for rank, failures in enumerate(reports):
        assert failures == [], f"rank {rank}: {failures}"
