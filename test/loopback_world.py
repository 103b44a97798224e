"""Runs N ranks of the real core runtime as threads of this process over the loopback transport,
so that negotiation, fusion and the collective algorithms are exercised without processes."""
import os
import threading

from horo_core.runtime import LoopbackHub, Runtime


class World:
    """size ranks. hosts optionally names the host of every rank (emulated: all are threads here);
    rank_env(r) optionally returns environment variables that rank r's runtime reads its settings
    from (they are set only while it is created)."""

    def __init__(self, size, hosts=None, rank_env=None):
        self.size = size
        self.hub = LoopbackHub(size, hosts)
        self.runtimes = [self._create(r, rank_env(r) if rank_env else {}) for r in range(size)]
        for rt in self.runtimes:
            rt.connect()

    def _create(self, rank, env):
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return Runtime(rank, self.size, loopback=self.hub)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def run(self, fn, timeout=120):
        """Calls fn(rt) on every rank concurrently; returns the list of results, re-raising the
        first exception (annotated with its rank). A rank that does not finish fails the test."""
        results, errors = self.run_collecting(fn, timeout)
        for r, e in enumerate(errors):
            if e is not None:
                raise AssertionError(f"rank {r} raised {type(e).__name__}: {e}") from e
        return results

    def run_collecting(self, fn, timeout=120):
        """Calls fn(rt) on every rank concurrently and returns (results, errors), one per rank."""
        results = [None] * self.size
        errors = [None] * self.size

        def body(r):
            try:
                results[r] = fn(self.runtimes[r])
            except BaseException as exc:
                errors[r] = exc

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.size)]
        for t in threads:
            t.start()
        for r, t in enumerate(threads):
            t.join(timeout)
            assert not t.is_alive(), f"rank {r} did not finish within {timeout} s (hang)"
        return results, errors

    def close(self):
        threads = [threading.Thread(target=rt.destroy) for rt in self.runtimes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.hub.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
