"""Control flow and structure: while (a counted loop over a tuple state), conditional (a
predicate or a branch index, two or three branches), call, fusion, async call-start/call-done,
opt-barrier and domain. Loop bodies, branches and callees are generated like the entry
(fewer instructions, at most two levels deep).

Loop-carried floats are treated as inexact inside the body (an iteration may have summed them)
and are squashed with tanh when the body would let them grow, so trip counts cannot overflow
them."""
from __future__ import annotations

from . import choices
from .program import Comp
from .values import MAX_BOUND, Arr, Tup, Value

MAX_DEPTH = 2


def _room(c: Comp, needed: int = 8) -> bool:
    return c.depth < MAX_DEPTH and c.mb.budget >= needed


def _grow(callee: Comp, steps: int) -> None:
    from .generator import grow      # the generator's table includes this module's generators
    grow(callee, steps)


def _carried(c: Comp, count: int) -> list[Value]:
    out = []
    for _ in range(count):
        kind = c.src.weighted([("float", 5), ("int", 2), ("pred", 1)])
        out.append(choices.operand(c, kind, max_bound=MAX_BOUND))
    return out


def _result_of(callee: Comp, shape: Arr, *, max_bound: float | None = None) -> Value:
    """A value of `shape` in `callee` (the newest such, or a constant), squashed with tanh
    when it may exceed `max_bound`."""
    found = [v for v in reversed(callee.pool) if v.shape == shape and not v.manual]
    value = found[0] if found and (len(found) == 1 or callee.src.boolean(0.8)) else \
        (callee.src.choice(found) if found else callee.constant(shape))
    if max_bound is not None and shape.is_float and value.bound > max_bound:
        value = callee.emit("tanh", shape, "tanh", [value], exact=False, bound=1.0)
    return value


def while_loop(c: Comp) -> Value | None:
    if not _room(c, 10):
        return None
    src = c.src
    carried = _carried(c, src.integer(1, 2))
    bounds = [max(1.0, v.bound) for v in carried]
    counter = c.scalar("s32", 0) if src.boolean(0.7) else c.need(Arr("s32", ()), exact=True)
    state = Tup((Arr("s32", ()),) + tuple(v.shape for v in carried))
    init = c.emit("tuple", state, "tuple", [counter, *carried], parts=[counter, *carried])
    trip = src.integer(0, 3)

    cond = c.mb.callee(c, "cond")
    p = cond.param(state, sharding=None)
    i = cond.unpack(p, [0])[0]
    limit = cond.scalar("s32", trip)
    cond.finish(cond.emit("compare", Arr("pred", ()), "compare", [i, limit], "direction=LT",
                          sharding=None))

    body = c.mb.callee(c, "body")
    facts = [Value("", Arr("s32", ()), True, float("inf"))] + \
        [Value("", v.shape, not v.arr.is_float, b) for v, b in zip(carried, bounds)]
    p = body.param(state, parts=facts, sharding=None)
    values = body.unpack(p)
    one = body.scalar("s32", 1)
    step = body.emit("add", Arr("s32", ()), "add", [values[0], one], bound=float("inf"))
    _grow(body, src.integer(1, 4))
    outs = [_result_of(body, v.arr, max_bound=b) for v, b in zip(carried, bounds)]
    body.finish(body.emit("tuple", state, "tuple", [step, *outs], parts=[step, *outs]))

    parts = [Value("", Arr("s32", ()), True, float("inf"))] + \
        [Value("", v.shape, not v.arr.is_float, b) for v, b in zip(carried, bounds)]
    loop = c.emit("while", state, "while", [init], f"condition={cond.name}, body={body.name}",
                  parts=parts)
    picked = src.subset(list(range(1, len(carried) + 1))) or [len(carried)]
    return c.unpack(loop, picked)[-1]


def conditional(c: Comp) -> Value | None:
    if not _room(c, 10):
        return None
    src = c.src
    form = src.choice(["pred", "index"])
    count = 2 if form == "pred" else src.integer(1, 3)
    result = _carried(c, 1)[0].arr
    operands, branches, exact, bound = [], [], True, 0.0
    for _ in range(count):
        arg = _carried(c, 1)[0] if src.boolean(0.7) else c.pick(lambda v: v.shape == result)
        arg = arg if arg is not None else _carried(c, 1)[0]
        branch = c.mb.callee(c, "branch")
        branch.param(arg.shape, exact=arg.exact, bound=arg.bound, parts=arg.parts, sharding=None)
        _grow(branch, src.integer(0, 3))
        out = _result_of(branch, result)
        exact, bound = exact and out.exact, max(bound, out.bound)
        branch.finish(out)
        operands.append(arg)
        branches.append(branch.name)
    if form == "pred":
        from .ops_elementwise import predicate_for
        selector = predicate_for(c, ())
        attrs = f"true_computation={branches[0]}, false_computation={branches[1]}"
    else:
        selector = c.need(Arr("s32", ()), exact=True)
        attrs = "branch_computations={" + ", ".join(branches) + "}"
    if bound > MAX_BOUND:
        bound = float("inf")
    return c.emit("conditional", result, "conditional", [selector, *operands], attrs,
                  exact=exact, bound=bound)


def _callee_with(c: Comp, stem: str, args: list[Value]) -> tuple[Comp, Value]:
    """A callee taking `args` (as parameters), grown a little; its result value."""
    callee = c.mb.callee(c, stem)
    for a in args:
        callee.param(a.shape, exact=a.exact, bound=a.bound, parts=a.parts, sharding=None)
    _grow(callee, c.src.integer(1, 3))
    out = [v for v in reversed(callee.pool) if not v.manual][0]
    callee.finish(out)
    return callee, out


def call(c: Comp) -> Value | None:
    if not _room(c):
        return None
    args = _carried(c, c.src.integer(1, 2))
    callee, out = _callee_with(c, "callee", args)
    return c.emit("call", out.shape, "call", args, f"to_apply={callee.name}", exact=out.exact,
                  bound=out.bound)


def fusion(c: Comp) -> Value | None:
    if not _room(c):
        return None
    args = _carried(c, c.src.integer(1, 2))
    callee, out = _callee_with(c, "fused_computation", args)
    kind = c.src.choice(["kLoop", "kOutput", "kInput"])
    return c.emit("fusion", out.shape, "fusion", args, f"kind={kind}, calls={callee.name}",
                  exact=out.exact, bound=out.bound)


def async_call(c: Comp) -> Value | None:
    if not _room(c):
        return None
    args = _carried(c, c.src.integer(1, 2))
    callee, out = _callee_with(c, "async_computation", args)
    started = Tup((Tup(tuple(a.shape for a in args)), out.shape, Arr("u32", ())))
    start = c.emit("call-start", started, "call-start", args,
                   f'async_execution_thread="thread_1", to_apply={callee.name}', keep=False)
    return c.emit("call-done", out.shape, "call-done", [start], exact=out.exact,
                  bound=out.bound)


def optimization_barrier(c: Comp) -> Value | None:
    members = _carried(c, c.src.integer(1, 3))
    shape = Tup(tuple(m.shape for m in members))
    t = c.emit("tuple", shape, "tuple", members, parts=members, keep=False)
    barrier = c.emit("opt-barrier", shape, "opt-barrier", [t], parts=members,
                     keep=False)
    return c.unpack(barrier, c.src.subset(list(range(len(members)))) or [0])[-1]


def domain(c: Comp) -> Value | None:
    from .shardings import sharding
    x = _carried(c, 1)[0]
    entry, exit_ = sharding(c.src, x.shape, c.n), sharding(c.src, x.shape, c.n)
    return c.emit("domain", x.shape, "domain", [x],
                  f'domain={{kind="sharding", entry={entry}, exit={exit_}}}', exact=x.exact,
                  bound=x.bound)


GENERATORS = [
    (while_loop, 3), (conditional, 3), (call, 2), (fusion, 1), (async_call, 1),
    (optimization_barrier, 1), (domain, 1),
]
