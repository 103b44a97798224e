"""Horo's errors as TensorFlow code expects them.

Horovod's TensorFlow collectives are TensorFlow ops: a failure sets the op's status, so it surfaces
as a ``tf.errors.OpError`` (a mismatch between ranks as ``FailedPreconditionError``), eagerly and
in graphs alike. Horo's run as Python; a failure of the core raises one of horo_core's errors. In
horo_tf that error is raised as the class below of the same name, which is both the horo_core error
(``except hvd.HoroMismatchError``, ``except RuntimeError`` keep working) and the TensorFlow error
Horovod would give, so ``except tf.errors.OpError`` catches it eagerly too. Inside a
``tf.function`` TensorFlow turns whatever a ``tf.numpy_function`` raises into
``tf.errors.UnknownError``, also an ``OpError``, with the message kept.
"""
import tensorflow as tf

from horo_core import errors as core


# Autograph rewrites an exception raised while a tf.function traces into a StagingError (unless
# its class is one of a few built-ins), which ``except ValueError`` or ``except hvd.HoroError``
# would no longer catch; TensorFlow's own errors opt out with this attribute, and so do Horo's.
core.HoroError.ag_pass_through = True


def _both(core_class, tf_class):
    def __init__(self, message):
        tf_class.__init__(self, None, None, message)  # (its Exception.__init__ clears args: first)
        core_class.__init__(self, message)

    doc = f"{core_class.__doc__} Also a ``tf.errors.{tf_class.__name__}``."
    return type(core_class.__name__, (core_class, tf_class), {"__init__": __init__, "__doc__": doc,
                                                              "__module__": __name__})


# The most derived first: converted() takes the first class the error is an instance of.
HoroMismatchError = _both(core.HoroMismatchError, tf.errors.FailedPreconditionError)
HoroShutdownError = _both(core.HoroShutdownError, tf.errors.AbortedError)
HoroTimeoutError = _both(core.HoroTimeoutError, tf.errors.DeadlineExceededError)
HoroPeerLostError = _both(core.HoroPeerLostError, tf.errors.UnknownError)
HoroInternalError = _both(core.HoroInternalError, tf.errors.UnknownError)
HoroInvalidArgument = _both(core.HoroInvalidArgument, tf.errors.InvalidArgumentError)
HoroUnsupportedError = _both(core.HoroUnsupportedError, tf.errors.UnimplementedError)
# A collective before hvd.init(): Horovod's op fails its CheckInitialized with FailedPrecondition.
HoroNotInitializedError = _both(core.HoroNotInitializedError, tf.errors.FailedPreconditionError)

_CONVERSIONS = [(c.__mro__[1], c) for c in (HoroMismatchError, HoroShutdownError, HoroTimeoutError, HoroPeerLostError,
                                          HoroInternalError, HoroInvalidArgument, HoroUnsupportedError,
                                          HoroNotInitializedError)]


def converted(error):
    """error as the class above for its horo_core class (its message and traceback kept), or
    error itself when it already is an OpError or has no TensorFlow counterpart."""
    if isinstance(error, tf.errors.OpError):
        return error
    for core_class, both in _CONVERSIONS:
        if isinstance(error, core_class):
            return both(str(error)).with_traceback(error.__traceback__)
    return error
