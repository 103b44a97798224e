"""hororun, the Horo launcher (imported as ``horo_runner``).

``hororun -np 4 python train.py`` runs four ranks; :func:`run` does the same for a Python function.
"""

__all__ = ["run"]


def __getattr__(name):
    # Imported on first use: ``python -m horo_runner.launch`` must find launch not yet imported, or
    # runpy warns on every launch.
    if name == "run":
        from .api import run
        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
