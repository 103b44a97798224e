"""Exception types of Horo, and the one place that maps C status codes onto them.

Each class also subclasses the builtin that Horovod raises in the same situation, so existing
``except ValueError`` / ``except RuntimeError`` / ``except HorovodInternalError`` clauses keep working.
"""


class HoroError(Exception):
    """Base class of every error Horo raises."""


class HoroInvalidArgument(HoroError, ValueError):
    """A bad argument on this rank (bad shape, unknown process set, duplicate name in flight...)."""


class HoroNotInitializedError(HoroError, ValueError):
    """An operation was called before ``init()`` (Horovod raises ValueError here too)."""


class HoroInternalError(HoroError, RuntimeError):
    """A collective failed; Horovod's ``HorovodInternalError``."""


HorovodInternalError = HoroInternalError


class HoroMismatchError(HoroInternalError):
    """Ranks submitted the same tensor name with different shape, dtype, op, root or scale factors."""


class HoroShutdownError(HoroInternalError):
    """Horo was shut down (explicitly, after a stall, or after another rank failed)."""


class HoroPeerLostError(HoroInternalError):
    """Another rank died or its connection broke."""


class HoroTimeoutError(HoroInternalError, TimeoutError):
    """A peer made no progress within the configured time."""


class HoroAuthError(HoroError, PermissionError):
    """A connection failed the job-secret challenge."""


class HoroUnsupportedError(HoroError, NotImplementedError):
    """The requested feature is not supported (for example the Adasum reduction)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-mode interrupt, exported for API compatibility."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


def _elastic_message(module_name):
    return (f"{module_name}: elastic training (hvd.elastic.run, its State classes, "
            "hororun --min-np/--max-np/--host-discovery-script) is not implemented in Horo; "
            "run a fixed number of ranks (README, 'Not supported yet')")


def missing_attribute(module_name, name):
    """The AttributeError of a module-level __getattr__ of horo_torch, horo_tf and horo_tf.keras:
    ``hvd.elastic`` names what is missing (Horovod's elastic training) instead of a bare miss."""
    if name == "elastic":
        return AttributeError(_elastic_message(f"{module_name}.elastic"))
    return AttributeError(f"module {module_name!r} has no attribute {name!r}")


def elastic_import_error(module_name):
    """The ImportError of ``import horo_torch.elastic`` / ``from horo_tf.keras import elastic``
    (Horovod's modules of elastic training), which names what is missing."""
    return ImportError(_elastic_message(module_name), name=module_name)


def data_service_import_error(module_name):
    """The ImportError of ``import horo_tf.compute_service`` / ``horo_tf.data`` (Horovod's tf.data
    service modules), which names what is missing instead of Python's bare "No module named"."""
    return ImportError(f"{module_name}: Horovod's tf.data service (TfDataServiceConfig, compute_service, "
                       "compute_worker) is not implemented in Horo; shard the dataset per rank with "
                       "dataset.shard(hvd.size(), hvd.rank()) (README, 'Not supported yet')", name=module_name)


def error_for(lib, code, message):
    """Returns the exception instance for a non-OK status code of the C ABI."""
    classes = {
        lib.HORO_ERR_INVALID_ARGUMENT: HoroInvalidArgument,
        lib.HORO_ERR_DUPLICATE_NAME: HoroInvalidArgument,
        lib.HORO_ERR_NOT_INITIALIZED: HoroNotInitializedError,
        lib.HORO_ERR_MISMATCH: HoroMismatchError,
        lib.HORO_ERR_SHUT_DOWN: HoroShutdownError,
        lib.HORO_ERR_PEER_LOST: HoroPeerLostError,
        lib.HORO_ERR_TIMEOUT: HoroTimeoutError,
        lib.HORO_ERR_AUTH: HoroAuthError,
        lib.HORO_ERR_UNSUPPORTED: HoroUnsupportedError,
    }
    return classes.get(code, HoroInternalError)(message)
