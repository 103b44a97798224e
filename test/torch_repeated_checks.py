"""Checks of collectives called again and again under one name, which horo_torch runs from a
description made once (its memo paths): what changes between calls must still reach the core.
test_torch_ops.py's job runs them on every rank with its other groups; the row arithmetic of
allgather, alltoall and reducescatter that both use is here too."""
import torch


def rows_of(total, size, index):
    """(offset, rows) of part `index` when `total` rows are split over `size` ranks, Horovod's way."""
    base, extra = divmod(total, size)
    offset = index * base + min(index, extra)
    return offset, base + (1 if index < extra else 0)


def sent_rows(src, dst):
    """Alltoall test pattern: rank src sends (src + dst) % 3 rows to rank dst."""
    return (src + dst) % 3


def check_repeated_named_calls(hvd, c, env):
    """allreduce_ under one name while its arguments change from call to call: every call reduces
    what it was given (the last call's description is reused only when everything matches); the
    out-of-place allreduce and broadcast without and with a graph; named broadcasts repeated."""
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) // 2

    def in_place(tensor, name, **kwargs):
        return hvd.allreduce_(tensor, name=name, **kwargs)

    def in_place_async(tensor, name, **kwargs):
        return hvd.synchronize(hvd.allreduce_async_(tensor, name=name, **kwargs))

    earlier = []  # the out-of-place results so far, with what they must still hold

    def out_of_place(reduce):
        def call(tensor, name, **kwargs):
            before = tensor.clone()
            got = reduce(tensor, name=name, **kwargs)
            c.same("out of place: a new tensor of its own, the input unchanged",
                   (got is tensor, got.data_ptr() in [e.data_ptr() for e, _ in earlier], torch.equal(tensor, before)),
                   (False, False, True))
            earlier.append((got, got.clone()))
            tensor.copy_(got)  # for run's check below
            return tensor
        return call

    # The same sequence through allreduce_, through allreduce_async_ + synchronize, which also
    # reuses the last call's description per name, and through the out-of-place allreduce and
    # allreduce_async, which do too (with an output of their own every call, earlier ones left alone).
    def waited_for(tensor, **kwargs):
        return hvd.synchronize(hvd.allreduce_async(tensor, **kwargs))

    for mode, call in (("allreduce_", in_place), ("allreduce_async_", in_place_async),
                       ("allreduce", out_of_place(hvd.allreduce)), ("allreduce_async", out_of_place(waited_for))):
        def run(what, tensor, want, **kwargs):
            got = call(tensor, "repeat." + mode, **kwargs)
            c.same(f"{mode} {what}: returns its argument", got is tensor, True)
            c.equal(f"{mode} {what}", tensor, want)

        for i in range(3):
            run(f"Sum, call {i}", torch.full((6,), float(r + 1)), torch.full((6,), float(total)), op=hvd.Sum)
        run("then Max", torch.full((6,), float(r + 1)), torch.full((6,), float(n)), op=hvd.Max)
        run("then another shape", torch.full((7,), float(r + 1)), torch.full((7,), float(total)), op=hvd.Sum)
        run("then another dtype", torch.full((7,), r + 1, dtype=torch.int32),
            torch.full((7,), total, dtype=torch.int32), op=hvd.Sum)
        run("then a prescale", torch.full((7,), float(r + 1), dtype=torch.float64),
            torch.full((7,), 2.0 * total, dtype=torch.float64), op=hvd.Sum, prescale_factor=2.0)
        run("then a postscale", torch.full((7,), float(r + 1), dtype=torch.float64),
            torch.full((7,), 0.5 * total, dtype=torch.float64), op=hvd.Sum, postscale_factor=0.5)
        run("then the default op (Average)", torch.full((7,), float(r + 1), dtype=torch.float64),
            torch.full((7,), total / n, dtype=torch.float64))
        run("then average=False", torch.full((7,), float(r + 1), dtype=torch.float64),
            torch.full((7,), float(total), dtype=torch.float64), average=False)
        run("Sum again", torch.full((6,), float(r + 1)), torch.full((6,), float(total)), op=hvd.Sum)
        # A column has the shape and dtype of the call before, but not its layout.
        base = torch.full((6, 2), float(r + 1))
        base[:, 1] = -1.0
        column = base[:, 0]
        run("then a non-contiguous view", column, torch.full((6,), float(total)), op=hvd.Sum)
        c.equal(f"{mode} ... the other column untouched", base[:, 1], torch.full((6,), -1.0))
        run("Sum once more", torch.full((6,), float(r + 1)), torch.full((6,), float(total)), op=hvd.Sum)
    check_tensor_changed_in_place(hvd, c)
    for index, (result, held) in enumerate(earlier):
        c.equal(f"out-of-place result {index} unchanged by the later calls", result, held)
    # Repeated named async calls in flight together, waited for in reverse order: each result lands
    # in the tensor its own call gave.
    for step in range(3):
        a, b = torch.full((4,), float(r + 1)), torch.full((4,), float(10 * (r + 1)))
        ha = hvd.allreduce_async_(a, name="repeat.a", op=hvd.Sum)
        hb = hvd.allreduce_async_(b, name="repeat.b", op=hvd.Sum)
        c.same(f"async step {step}: b, then a", (hvd.synchronize(hb) is b, hvd.synchronize(ha) is a), (True, True))
        c.equal(f"async step {step}: a", a, torch.full((4,), float(total)))
        c.equal(f"async step {step}: b", b, torch.full((4,), float(10 * total)))
    c.raises("average and op together", [ValueError], "op",
             lambda: hvd.allreduce_(torch.ones(6), name="repeat", average=True, op=hvd.Sum))
    # allreduce (out of place) records a graph only when one can be recorded.
    x = torch.full((3,), float(r + 1))
    y = hvd.allreduce(x, name="repeat.out", op=hvd.Sum)
    c.equal("allreduce without grad", y, torch.full((3,), float(total)))
    c.same("... a new tensor, input unchanged", (y is x, bool((x == r + 1).all())), (False, True))
    c.same("... no graph", (y.requires_grad, y.grad_fn), (False, None))
    w = torch.full((3,), float(r + 1), requires_grad=True)
    with torch.no_grad():
        y = hvd.allreduce(w, name="repeat.out", op=hvd.Sum)
    c.equal("allreduce of a leaf that requires grad, under no_grad", y, torch.full((3,), float(total)))
    c.same("... no graph", (y.requires_grad, y.grad_fn), (False, None))
    y = hvd.allreduce(w, name="repeat.out", op=hvd.Sum)
    c.same("with grad enabled: a graph", (y.requires_grad, type(y.grad_fn).__name__),
           (True, "HorovodAllreduceBackward"))
    y.sum().backward()
    c.equal("... its gradient (the Sum of every rank's ones)", w.grad, torch.full((3,), float(n)))
    # Named broadcasts, repeated with the root and the dtype changing.
    for root in (n - 1, 0, n - 1):
        for dtype in (torch.float32, torch.int64):
            b = torch.full((5,), 10 * r + 1, dtype=dtype)
            c.same(f"broadcast_ root {root} {dtype} returns its argument",
                   hvd.broadcast_(b, root, name="bc.repeat") is b, True)
            c.equal(f"named broadcast_ root {root} {dtype}", b, torch.full((5,), 10 * root + 1, dtype=dtype))
            x = torch.full((5,), 10 * r + 2, dtype=dtype)
            c.equal(f"named broadcast root {root} {dtype}", hvd.broadcast(x, root, name="bc.repeat.out"),
                    torch.full((5,), 10 * root + 2, dtype=dtype))
            c.equal("... input unchanged", x, torch.full((5,), 10 * r + 2, dtype=dtype))
    w = torch.full((3,), float(r + 1), requires_grad=True)
    with torch.no_grad():
        y = hvd.broadcast(w, 0, name="bc.repeat.grad")
    c.equal("broadcast of a leaf that requires grad, under no_grad", y, torch.ones(3))
    c.same("... no graph", (y.requires_grad, y.grad_fn), (False, None))
    y = hvd.broadcast(w, 0, name="bc.repeat.grad")
    c.same("broadcast with grad enabled: a graph", y.requires_grad, True)
    # The other differentiable collectives: no graph under no_grad, a graph otherwise.
    leaf = torch.full((n, 2), float(r + 1), requires_grad=True)
    calls = {
        "allgather": (lambda t: hvd.allgather(t, name="ng.allgather"),
                      torch.cat([torch.full((n, 2), float(s + 1)) for s in range(n)])),
        "grouped_allreduce": (lambda t: hvd.grouped_allreduce([t, t], op=hvd.Sum, name="ng.grouped")[1],
                              torch.full((n, 2), float(total))),
        "reducescatter": (lambda t: hvd.reducescatter(t, op=hvd.Sum, name="ng.reducescatter"),
                          torch.full((1, 2), float(total))),
        "alltoall": (lambda t: hvd.alltoall(t, name="ng.alltoall"),
                     torch.tensor([[float(s + 1)] * 2 for s in range(n)])),
        "alltoall with splits": (lambda t: hvd.alltoall(t, splits=[1] * n, name="ng.alltoall.splits")[0],
                                 torch.tensor([[float(s + 1)] * 2 for s in range(n)])),
    }
    for label, (call, want) in calls.items():
        with torch.no_grad():
            y = call(leaf)
        c.equal(f"{label} of a leaf that requires grad, under no_grad", y, want)
        c.same(f"... {label}: no graph", (y.requires_grad, y.grad_fn), (False, None))
        c.same(f"{label} with grad enabled: a graph", call(leaf).requires_grad, True)


def check_repeated_allgathers(hvd, c, env):
    """allgather under one name while the ranks' rows change from call to call. Horo gathers into a
    tensor of the last result's shape when the new result has its size, so each call here keeps
    this rank's rows, or the total, or neither, of the call before; every result must be exactly
    what was gathered, and a new tensor that later calls leave alone."""
    r, n = hvd.rank(), hvd.size()

    def gathered(rows_of, value, width, dtype):
        return torch.cat([torch.full((rows_of(s), width), float(10 * s + value), dtype=torch.float64)
                          for s in range(n)]).to(dtype)

    steps = [  # (label, rows of rank s, width)
        ("first call", lambda s: s + 1, 3),
        ("the same rows again", lambda s: s + 1, 3),
        ("and again", lambda s: s + 1, 3),
        ("the last rank's rows change", lambda s: s + 1 + (s == n - 1), 3),
        ("ranks 1 and 2 swap rows: same total", lambda s: {1: 3, 2: 2}.get(s, s + 1) if n >= 3 else s + 1, 3),
        ("rows of no bytes", lambda s: s + 1, 0),
        ("other rows of no bytes", lambda s: s + 2, 0),
        ("only the last rank has rows", lambda s: 2 * (s == n - 1), 3),
        ("no rank has rows", lambda s: 0, 3),
        ("back to the first", lambda s: s + 1, 3),
    ]
    modes = {
        "allgather": lambda x, name: hvd.allgather(x, name=name),
        "allgather_async": lambda x, name: hvd.synchronize(hvd.allgather_async(x, name=name)),
        "grouped_allgather": lambda x, name: hvd.grouped_allgather([x, x[:, :1]], name=name)[0],
        "allgather with a graph": lambda x, name: hvd.allgather(x.double().requires_grad_(), name=name).detach().to(
            x.dtype),
    }
    for dtype in (torch.float32, torch.int16):
        for mode, call in modes.items():
            kept = []
            for i, (label, rows_of, width) in enumerate(steps):
                x = torch.full((rows_of(r), width), float(10 * r + i), dtype=torch.float64).to(dtype)
                got = call(x, f"repeat.{mode}")
                want = gathered(rows_of, i, width, dtype)
                c.equal(f"{mode} {dtype} {label}", got, want)
                kept.append((label, got, want.clone()))
            for label, got, want in kept:
                c.equal(f"{mode} {dtype} {label}: unchanged by the later calls", got, want)


def check_repeated_reducescatters_and_alltoalls(hvd, c, env):
    """reducescatter and alltoall under one name while shapes, ops, scales and splits change from call
    to call. Horo reuses a name's description and lets the core write into a tensor of the last
    result's shape when the new result has its size; every result must be exactly this call's, and
    a tensor that later calls leave alone."""
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) // 2
    kept = []
    rs_steps = [  # (label, rows, width, op, prescale)
        ("first call", n + 1, 2, hvd.Sum, 1.0),
        ("the same again", n + 1, 2, hvd.Sum, 1.0),
        ("and again", n + 1, 2, hvd.Sum, 1.0),
        ("Max instead of Sum", n + 1, 2, hvd.Max, 1.0),
        ("Average", n + 1, 2, hvd.Average, 1.0),
        ("a prescale", n + 1, 2, hvd.Sum, 0.5),
        ("other rows", 2 * n + 1, 2, hvd.Sum, 1.0),
        ("rows of no bytes", 2 * n + 1, 0, hvd.Sum, 1.0),
        ("back to the first", n + 1, 2, hvd.Sum, 1.0),
    ]
    for dtype in (torch.float32, torch.float64):
        for i, (label, rows, width, op, prescale) in enumerate(rs_steps):
            pattern = torch.arange(rows * width, dtype=torch.float64).reshape(rows, width) % 5 + i
            x = (pattern * (r + 1)).to(dtype)
            full = {hvd.Sum: pattern * total, hvd.Max: pattern * n, hvd.Average: pattern * total / n}[op] * prescale
            off, k = rows_of(rows, n, r)
            want = full[off:off + k].to(dtype)
            got = hvd.reducescatter(x, name="repeat.rs", op=op, prescale_factor=prescale)
            c.equal(f"reducescatter {dtype} {label}", got, want)
            kept.append((f"reducescatter {dtype} {label}", got, want.clone()))

    def a2a_input(rows_to, step, dtype):
        return torch.cat([torch.full((rows_to(r, j), 2), float(100 * r + 10 * j + step), dtype=torch.float64)
                          for j in range(n)]).to(dtype)

    def a2a_want(rows_to, step, dtype):
        return torch.cat([torch.full((rows_to(s, r), 2), float(100 * s + 10 * r + step), dtype=torch.float64)
                          for s in range(n)]).to(dtype)

    a2a_steps = [  # (label, rows rank s sends rank j, splits given as)
        ("equal parts", lambda s, j: 2, None),
        ("equal parts again", lambda s, j: 2, None),
        ("splits", sent_rows, list),
        ("the same splits again", sent_rows, list),
        ("the same splits as a tensor", sent_rows, torch.tensor),
        ("other splits, the same total", lambda s, j: (s + j + 1) % 3, list),
        ("no rows to anyone", lambda s, j: 0, list),
        ("equal parts once more", lambda s, j: 2, None),
    ]
    for dtype in (torch.float32, torch.int16):
        for i, (label, rows_to, given_as) in enumerate(a2a_steps):
            x = a2a_input(rows_to, i, dtype)
            want = a2a_want(rows_to, i, dtype)
            if given_as is None:
                got = hvd.alltoall(x, name="repeat.a2a")
            else:
                got, received = hvd.alltoall(x, splits=given_as([rows_to(r, j) for j in range(n)]), name="repeat.a2a")
                c.equal(f"alltoall {dtype} {label}: received splits", received,
                        torch.tensor([rows_to(s, r) for s in range(n)], dtype=torch.int32))
            c.equal(f"alltoall {dtype} {label}", got, want)
            kept.append((f"alltoall {dtype} {label}", got, want.clone()))
    for label, got, want in kept:
        c.equal(f"{label}: unchanged by the later calls", got, want)
    if n > 1:
        c.raises("named reducescatter of a mismatched shape", [RuntimeError], "shape",
                 lambda: hvd.reducescatter(torch.ones(n + r, 2), name="repeat.rs", op=hvd.Sum))
        c.raises("named alltoall of rows not divisible by size", [ValueError], "divisible",
                 lambda: hvd.alltoall(torch.ones(n + 1, 2), name="repeat.a2a"))


def check_tensor_changed_in_place(hvd, c):
    """The same tensor object, changed between two calls of one name in ways that keep its data
    pointer, or that torch's version counter does not see (``.data =``): the core reads the tensor
    on every call of a repeated allreduce or in-place broadcast (horo_torch/_reading.py) and must
    notice each change, so that every call reduces (or receives) the tensor as it is now."""
    from horo_core._binding import lib
    from horo_torch import _allreduce_ops, _reading, mpi_ops
    r, n = hvd.rank(), hvd.size()
    # Every rank's tensor holds r + 1; value is what every call must give: the Sum (total) for the
    # allreduces, rank n - 1's n for the broadcast.
    total = n * (n + 1) // 2
    for name, reduce, memo, value in (
            ("changed.in_place", lambda t: hvd.allreduce_(t, name="changed.in_place", op=hvd.Sum),
             _allreduce_ops._last_allreduce, total),
            ("changed.copy", lambda t: hvd.allreduce(t, name="changed.copy", op=hvd.Sum),
             _allreduce_ops._last_allreduce_copy, total),
            ("changed.broadcast", lambda t: hvd.broadcast_(t, n - 1, name="changed.broadcast"),
             mpi_ops._last_broadcast, n)):

        def run(what, tensor, want):
            got = reduce(tensor)
            c.equal(f"{name}: {what}", got, want)
            return got

        t = torch.full((8,), float(r + 1))
        for i in range(2):
            run(f"call {i}", t, torch.full((8,), float(value)))
            t.fill_(float(r + 1))
        bound = memo[name][-1]
        c.same(f"{name}: the repeated call runs through the core's reading of the tensor",
               (_reading.reader() is not None, bound.func is lib.horo_run_read), (True, True))
        # The same memory seen as int32 through .data: the same address, another dtype.
        t.data = t.data.view(torch.int32)
        t.fill_(r + 1)
        run("after .data = another dtype at the same address", t, torch.full((8,), value, dtype=torch.int32))
        # A shorter view of the same memory: the same address, fewer elements.
        t = torch.full((8,), float(r + 1))
        reduce(t)
        backing = t.data
        backing.fill_(float(r + 1))
        t.data = backing[:3]
        run("after .data = a shorter view at the same address", t, torch.full((3,), float(value)))
        c.equal(f"{name}: ... the memory past the view untouched", backing[3:], torch.full((5,), float(r + 1)))
        t.fill_(float(r + 1))
        t.resize_(2, 2)
        t.fill_(float(r + 1))
        run("after resize_ to another shape", t, torch.full((2, 2), float(value)))
        t = torch.full((4, 2), float(r + 1))
        reduce(t)
        t.fill_(float(r + 1))
        t.t_()
        run("after t_(): the same shape's elements, transposed and not contiguous", t, torch.full((2, 4), float(value)))
        p = torch.nn.Parameter(torch.full((2, 4), float(r + 1)), requires_grad=False)
        run("a Parameter", p, torch.full((2, 4), float(value)))
        run("the Parameter again", p.fill_(float(r + 1)), torch.full((2, 4), float(value)))
