"""Which collective a new one in a graph waits on.

A collective runs as a ``numpy_function`` that blocks the executor thread running it until every
rank has submitted it. Independent collectives of one graph could start in different orders on
different ranks, and once every thread waits on one the others have not started, nothing moves. So
collectives are chained by control dependencies, each waiting on one traced before it:

* In a ``tf.function`` every stateful op runs on every call, so the chain runs through the whole
  function graph in tracing order. A ``tf.cond`` branch, a ``tf.while_loop`` body and a nested
  ``tf.function`` are graphs of their own there, called by one op of the graph around them (``If``,
  ``While``, ``StatefulPartitionedCall``...). Their chain starts with a wait on the chain's last
  collective outside (a control capture: the calling op waits), and once the calling op exists the
  next collective outside waits on it. Without that, a collective after a ``LossScaleOptimizer``'s
  ``apply``, whose gradient reduction runs in a ``tf.cond`` branch, started before or after it on
  different ranks.
* A TF1 graph (``session.run``) runs only what a run's fetches need, and a wait on an earlier
  collective makes that collective run too, with everything it needs. A collective therefore waits
  only on the last one that needs the same inputs from outside the graph: the same placeholders to
  feed and the same input pipelines to read (its *sources*). A collective that needs no feeds (a
  broadcast) never waits on the training step's, which needs its batch, nor does an evaluation on
  another input pipeline. The collectives of one Horo call (``traced_together``: the groups of one
  gradient reduction) are always chained, and one that waits on another needs that one's sources
  too. Collectives that a helper builds to run alone at once (``standalone``: variable and object
  broadcasts) are left out of the chains.
* In a TF1 graph, the chains are also kept per ``tf.cond`` branch and ``tf.while_loop`` body (TF1
  control flow keeps those in the graph): a collective after a ``tf.cond`` that waited on one in
  the branch not taken would never run. A branch's first collective waits on the chain's last one
  before the ``tf.cond``.

What stays unordered in a TF1 graph: collectives with different sources fetched by one run, and a
collective after a ``tf.cond`` against those inside its branches. Up to twice as many as TensorFlow
has inter-op threads minus one always complete (two ranks' sets of waiting collectives then
overlap); more may wait on each other (the stall warning names them). And a collective fetched
alone still runs the earlier ones it waits on: an allreduce of the loss built after ``minimize``
runs the gradients' reduction too.
"""
import contextlib
import threading
import weakref

import tensorflow as tf

_lock = threading.Lock()
# graph -> {(context, chain key) -> the last collective (or op calling one): its name, or (a weak
# reference to the enclosing function graph that holds it, its name) for one outside this graph}.
# Names, not ops, so that the values keep no graph alive.
_last = weakref.WeakKeyDictionary()
_sources = weakref.WeakKeyDictionary()  # graph -> {op name -> frozenset of its sources' names}
_call = threading.local()
# Function graphs: graph -> names of the graphs built inside it (branches, loop bodies, nested
# functions) that hold a collective, and how many of its ops have been looked at for their callers.
_holding = weakref.WeakKeyDictionary()
_looked_at = weakref.WeakKeyDictionary()

# Ops a run needs from outside the graph: feeds, and reads that consume an input pipeline.
_SOURCE_PREFIXES = ("Placeholder", "IteratorGetNext", "QueueDequeue", "ReaderRead")
_STANDALONE = object()


def link(graph, inputs, build):
    """Builds a collective in graph (build() makes its op under the control dependencies in force
    and returns its output tensors), waiting on the collective its chain says; returns build()'s."""
    token = getattr(_call, "token", None)
    if not graph.building_function and token is _STANDALONE:
        return build()
    with _lock:
        chains = _last.setdefault(graph, {})
        if graph.building_function:
            keys = [None]
            _follow_callers(graph, chains)
            if (None, None) not in chains:
                outside = _last_outside(graph)
                if outside is not None:  # a control capture: the op that calls this graph waits on it
                    chains[(None, None)] = outside
        else:
            keys = ([("call", token)] if token is not None else []) + \
                [("sources", _sources_of(graph, [t.op for t in inputs]))]
        context = _control_flow_context(graph)
        previous = _previous(graph, chains, context, keys)
        with tf.control_dependencies([previous] if previous is not None else []):
            outs = build()
        if outs:
            op = outs[0].op
            if not graph.building_function:  # filed under what it needs, the one it waits on's included
                keys = keys[:-1] + [("sources", _sources_of(graph, [op]))]
            for key in keys:
                chains[(context, key)] = op.name
        return outs


def _function_names(op):
    """The names of the functions that op calls (a branch, a loop's body and condition, a callee)."""
    names = []
    for value in op.node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return names


def _follow_callers(graph, chains):
    """In a function graph: the ops built since the last look that call a graph holding a
    collective become the chain's last, so that the next collective here waits on them."""
    holding = _holding.get(graph)
    if not holding:
        return
    ops = graph.get_operations()
    for op in ops[_looked_at.get(graph, 0):]:
        # A branch's or a loop body's function is named as its graph is; a nested tf.function's is
        # its graph's name between "__inference_" and a number.
        if any(name in holding or name.startswith("__inference_") and name[12:].rpartition("_")[0] in holding
               for name in _function_names(op)):
            chains[(None, None)] = op.name
    _looked_at[graph] = len(ops)


def _last_outside(graph):
    """For a function graph built inside other function graphs: marks each enclosing graph as
    holding a collective in the one inside it, and returns the innermost enclosing chain's last op
    (a collective, or an op that calls one), or None."""
    found = None
    while True:
        outer = getattr(graph, "outer_graph", None)
        if outer is None or not outer.building_function:
            return found
        _holding.setdefault(outer, set()).add(graph.name)
        if found is None:
            outer_chains = _last.setdefault(outer, {})
            _follow_callers(outer, outer_chains)
            last = outer_chains.get((None, None))
            if last is not None:
                found = last if isinstance(last, tuple) else (weakref.ref(outer), last)
        graph = outer


def _previous(graph, chains, context, keys):
    """The op that a collective built in context, on the given chains, waits on, or None. An op
    inside a cond branch may wait on one outside; nothing outside may wait on one inside, and a
    while loop's body may not wait on anything outside it."""
    while True:
        for key in keys:
            last = chains.get((context, key))
            if last is not None:
                owner, name = last if isinstance(last, tuple) else (weakref.ref(graph), last)
                return owner().get_operation_by_name(name)
        if context is None or type(context).__name__ != "CondContext":
            return None
        context = context.outer_context


@contextlib.contextmanager
def traced_together():
    """Chains the collectives traced inside (and inside nested uses) in a TF1 graph whatever their
    sources: for a call whose collectives always run together."""
    with _calling(object()):
        yield


@contextlib.contextmanager
def standalone():
    """Leaves the collectives traced inside out of the chains of a TF1 graph (not of a
    tf.function): for ones that a helper builds and runs alone."""
    with _calling(_STANDALONE):
        yield


@contextlib.contextmanager
def _calling(token):
    if getattr(_call, "token", None) is not None:  # nested: the outermost call decides
        yield
        return
    _call.token = token
    try:
        yield
    finally:
        _call.token = None


def _control_flow_context(graph):
    """The TF1 control-flow context (``tf.cond`` branch, ``tf.while_loop`` body) being built in graph,
    or None (outside any, and always in TF2 control flow, whose branches are graphs of their own)."""
    get = getattr(graph, "_get_control_flow_context", None)
    return get() if get is not None else None


def _in_while_loop(op):
    context = getattr(op, "_control_flow_context", None)
    return context is not None and context.GetWhileContext() is not None


def _sources_of(graph, ops):
    """The names of the source ops that ops need (through data and control inputs). Memoized per
    graph, except for ops in a while loop, whose back edges appear only once the loop is built; a
    walk cuts a loop's back edge where it meets an op it is still inside."""
    memo = _sources.setdefault(graph, {})
    walk = {}  # this walk's results and ops in progress (None)
    for root in ops:
        stack = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if not expanded and (op.name in memo or op.name in walk):
                continue
            preds = [t.op for t in op.inputs] + list(op.control_inputs)
            if not expanded:
                walk[op.name] = None
                stack.append((op, True))
                stack.extend((p, False) for p in preds)
                continue
            found = {op.name} if op.type.startswith(_SOURCE_PREFIXES) and op.type != "PlaceholderWithDefault" \
                else set()
            for p in preds:
                found |= walk.get(p.name) or memo.get(p.name) or frozenset()  # None: on the path, a back edge
            walk[op.name] = frozenset(found)
            if not _in_while_loop(op):
                memo[op.name] = walk[op.name]
    return frozenset().union(*(walk[op.name] if op.name in walk else memo[op.name] for op in ops))
