"""Which collective a new one in a graph waits on.

A collective runs as a ``numpy_function`` that blocks the executor thread running it until every
rank has submitted it. Independent collectives of one graph could start in different orders on
different ranks, and once every thread waits on one the others have not started, nothing moves. So
collectives are chained by control dependencies, each waiting on one traced before it:

* In a ``tf.function`` every stateful op runs on every call, so the chain runs through the whole
  function graph in tracing order.
* A TF1 graph (``session.run``) runs only what a run's fetches need, and a wait on an earlier
  collective makes that collective run too, with everything it needs. A collective therefore waits
  only on the last one that needs the same inputs from outside the graph: the same placeholders to
  feed and the same input pipelines to read (its *sources*). A collective that needs no feeds (a
  ``BroadcastGlobalVariablesHook``'s broadcast) never waits on the training step's, which needs its
  batch, nor does an evaluation on another input pipeline. The collectives of one Horo call
  (``traced_together``: the groups of one gradient reduction) are always chained.
* In a TF1 graph, the chains are also kept per ``tf.cond`` branch and ``tf.while_loop`` body (TF1
  control flow keeps those in the graph): a collective after a ``tf.cond`` that waited on one in
  the branch not taken would never run. A branch's first collective waits on the chain's last one
  before the ``tf.cond``.

What stays unordered in a TF1 graph: collectives with different sources fetched by one run. Up to
twice as many as TensorFlow has inter-op threads minus one always complete (two ranks' sets of
waiting collectives then overlap); more may wait on each other (the stall warning names them).
"""
import contextlib
import threading
import weakref

lock = threading.Lock()
_last = weakref.WeakKeyDictionary()  # graph -> {(context, chain key) -> the last collective op}
_sources = weakref.WeakKeyDictionary()  # graph -> {op name -> frozenset of its sources' names}
_together = threading.local()

# Ops a run needs from outside the graph: feeds, and reads that consume an input pipeline.
_SOURCE_PREFIXES = ("Placeholder", "IteratorGetNext", "QueueDequeue", "ReaderRead")


def before(graph, inputs):
    """The op a collective about to be traced in graph on inputs waits on (None: none), and the keys
    that after() records it under."""
    if graph.building_function:
        keys = [None]
    else:
        token = getattr(_together, "token", None)
        keys = ([("call", token)] if token is not None else []) + \
            [("sources", _sources_of(graph, [t.op for t in inputs]))]
    chains = _last.setdefault(graph, {})
    context = _control_flow_context(graph)
    recorded = [(context, key) for key in keys]
    while True:
        for key in keys:
            previous = chains.get((context, key))
            if previous is not None:
                return previous, recorded
        # An op inside a branch may wait on one outside; nothing outside may wait on one inside, and
        # a while loop's body may not wait on anything outside it.
        if context is None or type(context).__name__ != "CondContext":
            return None, recorded
        context = context.outer_context


def after(graph, keys, op):
    """Records op, the collective just traced, as the last of its chains."""
    chains = _last.setdefault(graph, {})
    for key in keys:
        chains[key] = op


@contextlib.contextmanager
def traced_together():
    """Chains the collectives traced inside (and inside nested uses) in a TF1 graph whatever their
    sources: for a call whose collectives always run together."""
    if getattr(_together, "token", None) is not None:
        yield
        return
    _together.token = object()
    try:
        yield
    finally:
        _together.token = None


def _control_flow_context(graph):
    """The TF1 control-flow context (``tf.cond`` branch, ``tf.while_loop`` body) being built in graph,
    or None (outside any, and always in TF2 control flow, whose branches are graphs of their own)."""
    get = getattr(graph, "_get_control_flow_context", None)
    return get() if get is not None else None


def _sources_of(graph, ops):
    """The names of the source ops that ops need (through data and control inputs), memoized per
    graph. A while loop's back edge is cut where the walk meets an op it is still inside."""
    memo = _sources.setdefault(graph, {})
    interned = {}
    for root in ops:
        stack = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if not expanded and op.name in memo:  # done, or on the walk's path (a loop's back edge)
                continue
            preds = [t.op for t in op.inputs] + list(op.control_inputs)
            if not expanded:
                memo[op.name] = None  # in progress
                stack.append((op, True))
                stack.extend((p, False) for p in preds if p.name not in memo)
                continue
            found = {op.name} if op.type.startswith(_SOURCE_PREFIXES) and op.type != "PlaceholderWithDefault" \
                else set()
            for p in preds:
                found |= memo.get(p.name) or frozenset()
            found = frozenset(found)
            memo[op.name] = interned.setdefault(found, found)
    return frozenset().union(*(memo[op.name] for op in ops)) if ops else frozenset()
