"""hororun, the Horo launcher (imported as ``horo_runner``).

``hororun -np 4 python train.py`` runs four ranks; :func:`run` does the same for a Python function.
"""
from .api import run

__all__ = ["run"]
