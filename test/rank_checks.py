"""Check collectors for multi-rank tests: each rank runs groups of checks and reports
(count, failures) instead of stopping at the first failure, so one launch covers many checks.
Framework-specific subclasses add value comparisons (equal, close)."""


class Checks:
    """Collects the outcome of every check of one group on one rank."""

    def __init__(self):
        self.count = 0
        self.failures = []

    def fail(self, what):
        self.failures.append(what)

    def same(self, what, got, want):
        self.count += 1
        if got != want:
            self.fail(f"{what}: got {got!r}, want {want!r}")

    def same_array(self, what, got, want):
        """NumPy arrays of equal shape and exactly equal values."""
        import numpy as np

        self.count += 1
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)[:1].tolist() if got.shape == want.shape else "shape"
            self.fail(f"{what}: got {got[:6].tolist()}, want {want[:6].tolist()} (first difference at {bad})")

    def raises(self, what, types, text, fn):
        """fn() must raise an instance of every class in types whose message contains text."""
        self.count += 1
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - the type is what is checked
            if not all(isinstance(exc, t) for t in types) or text not in str(exc):
                self.fail(f"{what}: raised {type(exc).__name__}: {str(exc)[:400]}; want "
                          f"{[t.__name__ for t in types]} with {text!r}")
            return exc
        self.fail(f"{what}: returned {value!r}; want {[t.__name__ for t in types]}")
        return None
