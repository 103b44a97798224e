"""Horo's framework-agnostic core: the compiled runtime (cffi), errors, settings, launcher
detection and rendezvous, shared by horo_torch and horo_tf."""
__version__ = "0.1.0"


def require_framework(module, adapter, framework, extra):
    """Imports module (the framework an adapter wraps) and returns it; where it is not installed,
    the error names the extra that installs it instead of failing deep inside the adapter."""
    import importlib
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as missing:
        if missing.name != module:
            raise
        raise ModuleNotFoundError(f"{adapter} needs {framework}, which is not installed: pip install "
                                  f"'horo[{extra}]' (or install {framework} yourself)", name=module) from None
