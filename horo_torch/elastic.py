"""Horovod's horovod.torch.elastic has no counterpart: importing this module raises an ImportError that says
elastic training is not implemented, instead of Python's bare "No module named"."""
from horo_core.errors import elastic_import_error

raise elastic_import_error(__name__)
