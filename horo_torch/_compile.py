"""torch.compile and Horo's collectives.

A collective has no place in a compiled graph, and TorchDynamo cannot trace into the core anyway (it
cannot even guard on the cffi library the calls go through). So, as Horovod's C-extension ops do, a
collective that compiled code calls runs eagerly: a graph break, after which the compiled code goes
on with the result. ``eager_under_compile`` gives a function that behaviour, and the functions that
torch calls back (gradient hooks, a wrapper's forward helpers) the same: a backward that compiled
code starts runs its hooks with Dynamo watching, which would otherwise compile Horo's bookkeeping
frame by frame.

A call costs three checks outside of compilation, about 100 ns in all: the third, whether the torch
profiler records (a module variable torch keeps for such checks), puts every public collective in a
``horo::<function>`` range of the profile, e.g. ``horo::allreduce_async_`` and ``horo::synchronize``,
as torch.distributed's collectives show up in it. While Dynamo traces the call, or
while it watches the frames that run (inside a compiled function, around a graph break), the call
goes through ``torch._disable_dynamo``'s wrapper instead: Dynamo neither inlines nor compiles that
wrapper, and it runs the function, and everything it calls, with Dynamo off
(``torch.compiler.disable``). That wrapper imports torch._dynamo (about 2 s of CPU) at its first
call, not when it is made, so that a process that never compiles never pays for it;
``torch.compiler.disable`` itself would import it at once, and made at the first traced call
instead, the call that makes it would be a graph break in the middle of Horo's code.
"""
import functools
import inspect

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
    docstring). A public function (a name without a leading underscore) runs in a
    ``horo::<name>`` range of the torch profiler while one records.

    The wrapper is written with fn's own parameters rather than ``*args, **kwargs``: forwarding
    those costs about 230 ns per call, as much as the rest of a small allreduce's Python path. Its
    defaults are fn's own objects (the process set's default is the global set itself, say).
    """
    empty = inspect.Parameter.empty
    signature = inspect.signature(fn)
    bare = signature.replace(parameters=[p.replace(default=empty, annotation=empty)
                                         for p in signature.parameters.values()], return_annotation=empty)
    forwarded = ", ".join(_forwarded(p) for p in signature.parameters.values())
    profiled = "" if fn.__name__.startswith("_") else (f"    if _profiler._is_profiler_enabled:\n"
                                                       f"        with _profiler.record_function(_horo_range):\n"
                                                       f"            return _horo_fn({forwarded})\n")
    source = (f"def call{bare}:\n"
              f"    if _tracing() or _dynamo_watching() is not None:\n"
              f"        return _horo_uncompiled({forwarded})\n"
              f"{profiled}"
              f"    return _horo_fn({forwarded})\n")
    scope = {"_tracing": _tracing, "_dynamo_watching": _dynamo_watching, "_horo_fn": fn,
             "_horo_uncompiled": torch._disable_dynamo(fn), "_profiler": torch.autograd.profiler,
             "_horo_range": f"horo::{fn.__name__}"}
    exec(source, scope)  # noqa: S102 - source made above from fn's parameter names only
    call = functools.wraps(fn)(scope["call"])
    call.__defaults__, call.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    return call


def _forwarded(parameter):
    kind = parameter.kind
    if kind is inspect.Parameter.VAR_POSITIONAL:
        return f"*{parameter.name}"
    if kind is inspect.Parameter.VAR_KEYWORD:
        return f"**{parameter.name}"
    if kind is inspect.Parameter.KEYWORD_ONLY:
        return f"{parameter.name}={parameter.name}"
    return parameter.name
