"""Horo's framework-agnostic core: the compiled runtime (cffi), errors, settings, launcher
detection and rendezvous, shared by horo_torch and horo_tf."""
__version__ = "0.1.0"


def require_framework(module, adapter, framework, requirements):
    """Imports module (the framework an adapter wraps) and returns it; where it is not installed,
    the error names what to install (requirements, pip's words) instead of failing deep inside the
    adapter. It names the packages, not this project's extra: on PyPI "horo" is another project."""
    import importlib
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as missing:
        if missing.name != module:
            raise
        raise ModuleNotFoundError(f"{adapter} needs {framework}, which is not installed: pip install {requirements} "
                                  f"(or, in a checkout of Horo, pip install -e '.[{module}]')", name=module) from None
