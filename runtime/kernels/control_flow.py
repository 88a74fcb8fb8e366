"""Control flow: call, fusion, while, conditional and the async wrappers (async-start,
async-update, async-done and the call-start/call-done spelling).

Semantics are XLA's:
- `call(args), to_apply=c` and `fusion(args), calls=c` evaluate `c` on the operands;
- `while(init), condition=c, body=b`: `state = init; while c(state): state = b(state)` (the
  body's iterations through `ctx.loop_body`, which keeps its loop-invariant values). Two
  loops can never finish, and are reported as a RuntimeFailure instead of hanging: one whose
  condition cannot change (`gspmdc.ir.while_loops`: it reads only state elements the body
  passes through unchanged), as soon as the condition first holds; and a deterministic loop
  (condition and body pure functions of the state on this partition) whose body leaves the
  state bitwise unchanged, after that iteration;
- `conditional(p, a, b)` with a `pred[]` selector runs `true_computation(a)` or
  `false_computation(b)`; with an `s32[]` index it runs `branch_computations[i]` on operand `i + 1`,
  and an index outside `[0, N)` runs the last branch;
- `async-start` (`calls=c`; the `call-start` spelling: `to_apply=c`) evaluates `c` on its
  operands and yields the async state `((operands...), result, context...)` with zero contexts;
  `async-update` passes the state on; `async-done` (`call-done`) returns its result element. The
  wrapped computation runs when the start is reached (XLA may overlap it with what follows; the
  values are the same).
"""
from __future__ import annotations

import numpy as np

from gspmdc.errors import RuntimeFailure
from gspmdc.ir import dtypes
from gspmdc.ir.ops import KERNELS
from gspmdc.ir.while_loops import invariant_condition_elements, is_pure


@KERNELS.register("call")
def _call(inst, args, ctx):
    return ctx.call(inst.attrs["to_apply"].name, args)


@KERNELS.register("fusion")
def _fusion(inst, args, ctx):
    return ctx.call(inst.attrs["calls"].name, args)


@KERNELS.register("while")
def _while(inst, args, ctx):
    condition, body = inst.attrs["condition"].name, inst.attrs["body"].name
    deterministic = _is_pure(ctx, body) and _is_pure(ctx, condition)
    state = args[0]
    iteration = 0
    iterate = ctx.loop_body(body)
    leaves, order = _leaves(state) if deterministic else None, None
    while ctx.call(condition, [state]):
        if iteration == 0:
            _refuse_if_endless(inst, ctx)
        new_state = iterate(state)
        iteration += 1
        if deterministic:
            new_leaves = _leaves(new_state)
            if order is None:
                order = _smallest_first(leaves)
            if _same_leaves(new_leaves, leaves, order):
                raise RuntimeFailure(
                    f"while loop {inst.name} cannot terminate: iteration {iteration} left the "
                    "loop state unchanged, so the condition stays true forever")
            leaves = new_leaves
        state = new_state
    return state


def _refuse_if_endless(inst, ctx) -> None:
    """Raise RuntimeFailure when the condition of `inst`, which has just held, cannot change
    (`invariant_condition_elements`), before the body runs even once."""
    key = ("invariant condition", inst)
    if key not in ctx.cache:
        ctx.cache[key] = invariant_condition_elements(inst, ctx.module)
    read = ctx.cache[key]
    if read is not None:
        elements = f"reads only loop-state element{'s' if len(read) > 1 else ''} " \
            f"{', '.join(map(str, read))}, which the body passes through unchanged" if read \
            else "reads nothing of the loop state"
        raise RuntimeFailure(f"while loop {inst.name} cannot terminate: its condition holds and "
                             f"{elements}, so it holds forever")


def _is_pure(ctx, computation_name: str) -> bool:
    """Whether the computation (with everything it calls) is a pure function of its arguments
    on this partition (`is_pure`). (A partitioned loop whose counter lives on another device
    keeps its local state unchanged while its condition, reading the counter through a
    collective, moves on.)"""
    key = ("pure", computation_name)
    if key not in ctx.cache:
        ctx.cache[key] = is_pure(ctx.module.computation(computation_name), ctx.module)
    return ctx.cache[key]


def _smallest_first(leaves: list) -> list[int]:
    """The positions of `leaves` (the loop state's, whose shapes every iteration keeps), smallest
    first: a loop whose counter moves is told apart after one scalar comparison."""
    return sorted(range(len(leaves)), key=lambda i: getattr(leaves[i], "size", 0))


def _same_leaves(a_leaves: list, b_leaves: list, order: list[int]) -> bool:
    """Bitwise-equal leaves of two values (NaNs equal), compared in `order`."""
    for i in order:
        x, y = a_leaves[i], b_leaves[i]
        if x is y:
            continue
        if not isinstance(x, np.ndarray):
            if x != y:
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not np.array_equal(np.ascontiguousarray(x).view(np.uint8),
                              np.ascontiguousarray(y).view(np.uint8)):
            return False
    return True


def _leaves(value) -> list:
    if isinstance(value, tuple):
        return [leaf for element in value for leaf in _leaves(element)]
    return [value]


@KERNELS.register("conditional")
def _conditional(inst, args, ctx):
    selector = args[0]
    branches = inst.branch_computation_names()
    if "branch_computations" in inst.attrs:
        index = int(selector)
        if not 0 <= index < len(branches):
            index = len(branches) - 1
    else:
        index = 0 if selector else 1
    return ctx.call(branches[index], [args[index + 1]])


@KERNELS.register("async-start", "call-start")
def _async_start(inst, args, ctx):
    computation = inst.attrs["calls" if "calls" in inst.attrs else "to_apply"]
    result = ctx.call(computation.name, args)
    contexts = tuple(np.zeros(s.dims, dtypes.numpy_dtype(s.element_type))
                     for s in inst.shape.elements[2:])
    return (tuple(args), result) + contexts


@KERNELS.register("async-update")
def _async_update(inst, args, ctx):
    return args[0]


@KERNELS.register("async-done", "call-done")
def _async_done(inst, args, ctx):
    return args[0][1]
