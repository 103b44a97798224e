"""torch.compile and Horo's collectives.

A collective has no place in a compiled graph, and TorchDynamo cannot trace into the core anyway (it
cannot even guard on the cffi library the calls go through). So, as Horovod's C-extension ops do, a
collective that compiled code calls runs eagerly: a graph break, after which the compiled code goes
on with the result. ``eager_under_compile`` gives a function that behaviour, and the functions that
torch calls back (gradient hooks, a wrapper's forward helpers) the same: a backward that compiled
code starts runs its hooks with Dynamo watching, which would otherwise compile Horo's bookkeeping
frame by frame.

A call costs two checks outside of compilation. While Dynamo traces the call, or while it watches
the frames that run (inside a compiled function, around a graph break), the call goes through
``torch._disable_dynamo``'s wrapper instead: Dynamo neither inlines nor compiles that wrapper, and
it runs the function, and everything it calls, with Dynamo off (``torch.compiler.disable``). That
wrapper imports torch._dynamo (about 2 s of CPU) at its first call, not when it is made, so that a
process that never compiles never pays for it; ``torch.compiler.disable`` itself would import it
at once, and made at the first traced call instead, the call that makes it would be a graph break
in the middle of Horo's code.
"""
import functools

import torch

_tracing = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)  # (before torch 2.5)
try:
    # Not None while Dynamo watches the frames that start: inside a compiled function, graph breaks included.
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _dynamo_watching
except ImportError:  # pragma: no cover (torch 2.3 to 2.13 have it)
    def _dynamo_watching():
        return None


def eager_under_compile(fn):
    """fn, run eagerly, whole, where torch.compile would trace or compile it (see the module's
    docstring)."""
    uncompiled = torch._disable_dynamo(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _tracing() or _dynamo_watching() is not None:
            return uncompiled(*args, **kwargs)
        return fn(*args, **kwargs)
    return call
