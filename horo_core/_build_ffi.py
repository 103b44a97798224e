"""cffi build script: compiles the C++17 core and its C ABI into ``horo_core._horo_cffi``.

Out-of-line API mode. The declarations cffi sees are the region between the cdef markers of
``horo_core/include/horo/horo.h``, read here, so no constant is ever copied by hand into Python.
Nothing is compiled against PyTorch or TensorFlow.
"""
import glob
import os
import re

from cffi import FFI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "horo_core", "include", "horo", "horo.h")


def cdef_text():
    with open(HEADER) as f:
        text = f.read()
    match = re.search(r"/\* cdef begin \*/(.*?)/\* cdef end \*/", text, re.S)
    if match is None:
        raise RuntimeError(f"{HEADER} has no cdef region")
    return match.group(1)


def core_files(pattern):
    """The core's files matching pattern under horo_core/src, relative to the project root, as
    setuptools wants them (glob's root_dir needs Python 3.10)."""
    found = glob.glob(os.path.join(ROOT, "horo_core", "src", "**", pattern), recursive=True)
    return sorted(os.path.relpath(path, ROOT) for path in found)


ffibuilder = FFI()
ffibuilder.cdef(cdef_text())
ffibuilder.set_source(
    "horo_core._horo_cffi",
    '#include "horo/horo.h"',
    sources=core_files("*.cc"),
    # What else the build reads: a changed header or linker map rebuilds the core (setuptools
    # compares only sources with the built library otherwise), and setuptools puts these files in
    # the source distribution, which needs them to build.
    depends=core_files("*.h") + [os.path.join("horo_core", "include", "horo", "horo.h"),
                                 os.path.join("horo_core", "horo.map")],
    include_dirs=[os.path.join("horo_core", "include"), os.path.join("horo_core", "src")],
    source_extension=".cpp",
    language="c++",
    # Portable optimised build: no -march=native; kernels dispatch to AVX2/AVX-512 at run time.
    extra_compile_args=["-std=c++17", "-O3", "-g0", "-Wno-unused-parameter"],
    extra_link_args=["-pthread", "-ldl", "-Wl,--version-script=" + os.path.join("horo_core", "horo.map")],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
