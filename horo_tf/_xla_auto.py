"""Keras's ``compile(jit_compile="auto")`` in a Horo job.

Keras 3 turns XLA on for "auto" when a GPU is visible (``Trainer._resolve_auto_jit_compile``), and
XLA cannot compile the ``tf.numpy_function`` that carries Horo's collectives: every Horovod Keras
script would fail on a GPU machine. So "auto" resolves to False for a model whose compiled steps
may run a collective: one trained by a Horo optimizer (horo_tf.keras), and one whose class
defines its own ``train_step``, ``test_step`` or ``predict_step`` (Horovod's TF2 pattern runs a
``DistributedGradientTape`` there). A model holding SyncBatchNormalization says so itself
(``supports_jit``). Other models keep Keras's choice, and an explicit ``jit_compile=True`` is left
alone (refused with a message when traced). If Keras moves the method, nothing is patched and that
message is what a user sees.
"""

_STEPS = ("train_step", "test_step", "predict_step")


def resolve_auto_xla_off_for_horo():
    try:
        from keras.src.trainers import trainer
    except ImportError:  # pragma: no cover - a Keras without that module
        return
    resolve = getattr(trainer.Trainer, "_resolve_auto_jit_compile", None)
    if resolve is None or getattr(resolve, "_horo_wrapped", False):
        return

    def resolve_auto_jit_compile(self):
        if _may_run_collectives(self):
            return False
        return resolve(self)

    resolve_auto_jit_compile._horo_wrapped = True
    trainer.Trainer._resolve_auto_jit_compile = resolve_auto_jit_compile


def _may_run_collectives(model):
    from horo_tf.keras.optimizer import _uses_horo  # here: horo_tf.keras imports this module's package
    return _uses_horo(getattr(model, "optimizer", None)) or any(_own_step(type(model), step) for step in _STEPS)


def _own_step(cls, step):
    """Whether the class that defines cls's step is the user's (not one of Keras's)."""
    for klass in cls.__mro__:
        if step in vars(klass):
            return not klass.__module__.startswith("keras.")
    return False
