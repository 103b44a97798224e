"""Loads the compiled core and offers ``check(rc)``, the single translation point from C status
codes to Python exceptions."""
from horo_core.errors import HoroError, error_for

try:
    from horo_core._horo_cffi import ffi, lib
except ImportError as exc:  # pragma: no cover - only when the extension was never built
    import os as _os
    raise ImportError(
        f"the Horo core extension (horo_core._horo_cffi) is not built in {_os.path.dirname(__file__)}; install "
        "the package with 'pip install -e .' from the repository root. If Horo is installed, this source "
        "tree comes first on sys.path and hides it: run from another directory") from exc


def last_error():
    return ffi.string(lib.horo_last_error()).decode("utf-8", "replace")


def check(rc, message=None):
    """Raises the matching HoroError subclass unless rc is HORO_OK. message: the error text when
    the caller read it earlier (a later call replaces the thread's last error)."""
    if rc != lib.HORO_OK:
        raise error_for(lib, rc, last_error() if message is None else message)


__all__ = ["ffi", "lib", "check", "last_error", "HoroError"]
