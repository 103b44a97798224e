"""Gradient hooks that parameters keep without keeping their owner (a DistributedOptimizer or a
DistributedDataParallel wrapper) alive: a dropped owner is collected, and its hooks go with it, as
torch's DDP hooks go with its reducer and Horovod's with its gradient accumulators."""
import weakref


def weak_hook(owner, method, *args):
    """A hook that calls owner.<method>(*args) while owner lives, and does nothing after."""
    owner_ref = weakref.ref(owner)

    def hook(*unused):
        live = owner_ref()
        if live is not None:
            getattr(live, method)(*args)
    return hook


def remove_when_collected(owner, handles):
    """Removes the hook handles once owner is garbage collected."""
    weakref.finalize(owner, _remove, list(handles))


def _remove(handles):
    for handle in handles:
        handle.remove()
