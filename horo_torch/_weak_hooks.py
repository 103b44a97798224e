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


def hook_gradients_ready(owner, params, method):
    """Calls owner.<method>(p) each time autograd has accumulated p.grad, for every p of params,
    while owner lives; the hooks are removed when owner is collected.

    Returns:
        What keeps the hooks: handles, or on torch < 2.1 the gradient accumulator nodes they hang on.
    """
    kept, removable = [], []
    for p in params:
        hook = weak_hook(owner, method, p)
        if hasattr(p, "register_post_accumulate_grad_hook"):
            removable.append(p.register_post_accumulate_grad_hook(hook))
            kept.append(removable[-1])
        else:  # torch < 2.1: the hook of the node that accumulates p.grad
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(hook)
            kept.append(accumulator)  # keeps the node (and its hook) alive
    remove_when_collected(owner, removable)  # the model may be wrapped again, with another optimizer
    return kept


def remove_when_collected(owner, handles):
    """Removes the hook handles once owner is garbage collected."""
    weakref.finalize(owner, _remove, list(handles))


def _remove(handles):
    for handle in handles:
        handle.remove()
