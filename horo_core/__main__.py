"""``python -m horo_core info``: what is built and the effective settings."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["info"]:
        print("usage: python -m horo_core info", file=sys.stderr)
        return 2
    import horo_core
    from horo_core import config
    from horo_core._binding import ffi, lib
    print(f"Horo {horo_core.__version__} (core {ffi.string(lib.horo_version()).decode()})")
    print(f"  reduction kernels: {ffi.string(lib.horo_cpu_features()).decode() or 'baseline'}")
    print("  transports: tcp, shared memory (ranks on one host), loopback (one rank)")
    print(f"  nccl: {_nccl_found()}")
    for name in ("torch", "tensorflow"):  # not imported: importing TensorFlow takes 9 s of CPU
        print(f"  {name}: {horo_core.installed_version(name) or 'not installed'}")
    print("Settings (HORO_<NAME>, or HOROVOD_<NAME>):")
    for s in config.settings():
        print(f"  {s.name:<28} {s.value:<12} default {s.default:<10} {s.doc}")
    return 0


def _nccl_found():
    """The NCCL that CUDA collectives would load (found at run time, never linked), or why none."""
    from horo_core import nccl
    try:
        path, version, _ = nccl.find()
    except nccl.NcclNotFound as e:
        return f"not loadable: {e}"
    if path is None:
        return ("not found (pip install nvidia-nccl-cu12 or -cu13, or set HORO_NCCL_LIBRARY); CUDA tensors "
                "are staged through host memory")
    return f"{version // 10000}.{version // 100 % 100}.{version % 100} ({path})"


if __name__ == "__main__":
    sys.exit(main())
