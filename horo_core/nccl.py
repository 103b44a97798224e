"""Where NCCL comes from: the search order for the library that CUDA collectives use.

NCCL is never linked at build time. In this order, the first candidate that loads is used:

1. ``HORO_NCCL_LIBRARY`` (or ``HOROVOD_NCCL_LIBRARY``): a path. When it is set and does not load,
   that is an error naming the path, not a silent fallback.
2. ``nvidia/nccl/lib/libnccl.so.2`` of an installed ``nvidia-nccl-cu13`` or ``nvidia-nccl-cu12``
   wheel (the copy PyTorch itself loads, so the process ends up with one NCCL).
3. ``libnccl.so.2`` as the dynamic linker finds it (LD_LIBRARY_PATH, ldconfig).

Loading needs no GPU: ``version()`` works on any machine and answers 0 when no NCCL is found.
"""
import functools
import importlib.util
import os
from typing import List, Optional, Tuple

from horo_core import config
from horo_core._binding import check, ffi, lib
from horo_core.errors import HoroError

SONAME = "libnccl.so.2"


class NcclNotFound(HoroError, RuntimeError):
    """HORO_NCCL_LIBRARY names a library that does not load as NCCL."""


def wheel_library_paths() -> List[str]:
    """libnccl.so.2 of every installed nvidia-nccl-cu* wheel (both install to nvidia/nccl/lib)."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    paths = []
    for folder in spec.submodule_search_locations or []:
        candidate = os.path.join(folder, "lib", SONAME)
        if os.path.exists(candidate):
            paths.append(candidate)
    return paths


def candidates() -> Tuple[List[str], bool]:
    """The paths to try, in order, and whether they come from HORO_NCCL_LIBRARY (then exclusive)."""
    explicit = config.value("NCCL_LIBRARY")
    if explicit:
        return [explicit], True
    return wheel_library_paths() + [SONAME], False


def library_version(path: str) -> int:
    """Loads the library at path and returns its NCCL version code (22907 for 2.29.7).

    Raises:
        HoroError (HoroUnsupportedError): the file does not exist, is not a shared library, or is
            not NCCL; the message names the path and the reason.
    """
    version = ffi.new("int32_t*")
    check(lib.horo_nccl_library_version(path.encode(), version))
    return version[0]


def find() -> Tuple[Optional[str], int, List[str]]:
    """(path, version, reasons): the first candidate that loads, or (None, 0, why each failed).

    Raises:
        NcclNotFound: HORO_NCCL_LIBRARY is set and that library does not load.
    """
    paths, explicit = candidates()
    reasons = []
    for path in paths:
        try:
            return path, library_version(path), reasons
        except HoroError as exc:
            if explicit:
                raise NcclNotFound(f"HORO_NCCL_LIBRARY={path}: {exc}") from None
            reasons.append(str(exc))
    return None, 0, reasons


@functools.lru_cache(maxsize=None)
def _found():
    return find()


def version() -> int:
    """The version code of the NCCL that CUDA collectives would use; 0 when none loads (also when
    HORO_NCCL_LIBRARY is bad: the first CUDA collective reports that error)."""
    try:
        return _found()[1]
    except NcclNotFound:
        return 0
