"""Horovod's horovod.tensorflow.data (compute_service, compute_worker: the tf.data service) has no
counterpart: importing this package raises an ImportError that says so, instead of Python's bare
"No module named"."""
from horo_core.errors import data_service_import_error

raise data_service_import_error(__name__)
