"""Gradient hooks that parameters keep without keeping their owner (a DistributedOptimizer or a
DistributedDataParallel wrapper) alive: a dropped owner is collected, and its hooks go with it, as
torch's DDP hooks go with its reducer and Horovod's with its gradient accumulators."""
import weakref

import torch

from horo_torch._compile import eager_under_compile


def weak_hook(owner, method, *args):
    """A hook that calls owner.<method>(*args) while owner lives, and does nothing after."""
    owner_ref = weakref.ref(owner)

    def hook(*unused):
        _call_if_live(owner_ref, method, args)
    return hook


@eager_under_compile
def _call_if_live(owner_ref, method, args):
    # A backward that compiled code starts runs its hooks under torch.compile too: they run eagerly.
    live = owner_ref()
    if live is not None:
        getattr(live, method)(*args)


def hook_gradients_ready(owner, params, method):
    """Calls owner.<method>(p) each time autograd has accumulated p.grad, for every p of params,
    while owner lives; the hooks are removed when owner is collected.

    The hooks hang on the nodes that accumulate the gradients, as Horovod's do, not on the
    parameters (register_post_accumulate_grad_hook): torch runs a node's hooks after every
    post-accumulate hook of its parameter, whichever was registered first. So a user's hook that
    scales or clips p.grad in place, registered after the optimizer was made, has finished before
    owner reads p.grad; a parameter's hooks run in the order they were registered, and the user's
    change would race with a reduction already started.

    Returns:
        The gradient accumulator nodes, which the owner keeps: while they live, every graph
        accumulates its parameter's gradient through the same node, with the hook.
    """
    accumulators, handles = [], []
    with torch.enable_grad():  # the optimizer may be made under no_grad(); the node exists all the same
        for p in params:
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            handles.append(accumulator.register_hook(weak_hook(owner, method, p)))
            accumulators.append(accumulator)
    remove_when_collected(owner, handles)  # the model may be wrapped again, with another optimizer
    return accumulators


def remove_when_collected(owner, handles):
    """Removes the hook handles once owner is garbage collected."""
    weakref.finalize(owner, _remove, list(handles))


def _remove(handles):
    for handle in handles:
        handle.remove()
