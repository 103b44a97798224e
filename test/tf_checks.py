"""The report that the TensorFlow tests' ranks fill in: one launch per world size runs many groups
of checks (TensorFlow takes seconds to import) and returns, per group, how many checks ran and
which failed."""
import traceback

import numpy as np

import rank_checks

CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "HORO_PEER_TIMEOUT_SECONDS": "60",
             "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": "",
             # A guard: ranks that stopped meeting fail the test, instead of waiting for CI's time limit.
             "HORO_STALL_SHUTDOWN_TIME_SECONDS": "120"}


class Checks(rank_checks.Checks):
    """rank_checks.Checks plus exact and tolerance comparisons of TF tensors and arrays."""

    def equal(self, what, got, want, dtype=None):
        """got (a tensor or array) must have want's shape and exactly want's values (and dtype)."""
        self.count += 1
        got_arr = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
        want_arr = np.asarray(want)
        if got_arr.dtype.kind == "f" and want_arr.dtype != got_arr.dtype:
            want_arr = want_arr.astype(got_arr.dtype)  # exact in the result's precision
        if dtype is not None and got.dtype != dtype:
            self.fail(f"{what}: dtype {got.dtype}, want {dtype}")
        elif got_arr.shape != want_arr.shape or not np.array_equal(got_arr.astype(np.float64),
                                                                   want_arr.astype(np.float64)):
            self.fail(f"{what}: got {got_arr.shape} {got_arr.ravel()[:8].tolist()}, "
                      f"want {want_arr.shape} {want_arr.ravel()[:8].tolist()}")

    def close(self, what, got, want, rtol=1e-5, atol=1e-6):
        self.count += 1
        got_arr, want_arr = np.asarray(got), np.asarray(want)
        if got_arr.shape != want_arr.shape or not np.allclose(got_arr, want_arr, rtol=rtol, atol=atol):
            diff = np.max(np.abs(got_arr - want_arr)) if got_arr.shape == want_arr.shape else "shape"
            self.fail(f"{what}: max difference {diff} (shapes {got_arr.shape} vs {want_arr.shape})")



def run_groups(groups, *args):
    """Runs every group(c, *args) and returns {name: (checks, failures)}; a group that raises is a
    failure and the next group still runs."""
    report = {}
    for fn in groups:
        c = Checks()
        try:
            fn(c, *args)
        except Exception:  # noqa: BLE001 - reported, and the run goes on with the next group
            c.fail(f"raised:\n{traceback.format_exc()}")
        report[fn.__name__] = (c.count, c.failures)
    return report


def assert_reports(reports, size, groups):
    """Every rank ran every group, each group ran at least one check, and none failed."""
    assert len(reports) == size
    problems = []
    for rank, report in enumerate(reports):
        assert list(report) == [g.__name__ for g in groups]
        for group, (count, failures) in report.items():
            problems += [f"rank {rank} {group}: {f}" for f in failures]
            if count == 0:
                problems.append(f"rank {rank} {group}: no check ran")
    assert not problems, "\n".join(problems[:60])
