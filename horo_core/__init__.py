"""Horo's framework-agnostic core: the compiled runtime (cffi), errors, settings, launcher
detection and rendezvous, shared by horo_torch and horo_tf."""
import functools

__version__ = "0.1.0"


def installed_version(module):
    """The version of the distribution that installs module (tensorflow-cpu's for tensorflow),
    found without importing module; "installed" where no distribution names it, None where module
    is not found. hororun --check-build took 14 s when it imported the frameworks instead."""
    import importlib.metadata
    import importlib.util
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    for distribution in [module] + _distributions_of_modules().get(module, []):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "installed"


@functools.lru_cache(maxsize=None)
def _distributions_of_modules():
    """{top-level module: [distributions that install it]}, read once: it reads every installed
    distribution's file list (a quarter of a second here)."""
    import importlib.metadata
    return importlib.metadata.packages_distributions()


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
