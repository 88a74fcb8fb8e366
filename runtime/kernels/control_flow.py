"""Control flow: call, fusion, while, conditional and the async wrappers (async-start,
async-update, async-done and the call-start/call-done spelling).

Semantics are XLA's:
- `call(args), to_apply=c` and `fusion(args), calls=c` evaluate `c` on the operands;
- `while(init), condition=c, body=b`: `state = init; while c(state): state = b(state)`; a
  deterministic loop (condition and body pure functions of the state on this partition) whose
  body leaves the state bitwise unchanged can never finish, which is reported as a
  RuntimeFailure instead of hanging;
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
from gspmdc.ir.ops import COLLECTIVES, HOST_IO, KERNELS, RNG_STATE



@KERNELS.register("call")
def _call(inst, args, ctx):
    return ctx.call(inst.attrs["to_apply"].name, args)


@KERNELS.register("fusion")
def _fusion(inst, args, ctx):
    return ctx.call(inst.attrs["calls"].name, args)


@KERNELS.register("while")
def _while(inst, args, ctx):
    condition, body = inst.attrs["condition"].name, inst.attrs["body"].name
    deterministic = _is_deterministic(ctx, body) and _is_deterministic(ctx, condition)
    state = args[0]
    iteration = 0
    while ctx.call(condition, [state]):
        new_state = ctx.call(body, [state])
        iteration += 1
        if deterministic and _same_value(new_state, state):
            raise RuntimeFailure(
                f"while loop {inst.name} cannot terminate: iteration {iteration} left the loop "
                "state unchanged, so the condition stays true forever")
        state = new_state
    return state


#: ops whose results are not a function of their operands on this partition: random numbers,
#: and values from other partitions (collectives) or the host
_IMPURE_OPCODES = RNG_STATE | COLLECTIVES | HOST_IO


def _is_deterministic(ctx, computation_name: str) -> bool:
    """Whether the computation (with everything it calls) is a pure function of its arguments
    on this partition. (A partitioned loop whose counter lives on another device keeps its
    local state unchanged while its condition, reading the counter through a collective, moves
    on.)"""
    key = ("deterministic", computation_name)
    if key not in ctx.cache:
        comp = ctx.module.computation(computation_name)
        ctx.cache[key] = all(
            inst.opcode not in _IMPURE_OPCODES
            and not (inst.opcode == "custom-call" and inst.attr("custom_call_has_side_effect"))
            and all(_is_deterministic(ctx, name) for name in inst.called_computation_names())
            for inst in comp.instructions)
    return ctx.cache[key]


def _same_value(a, b) -> bool:
    """Bitwise-equal values (tuples leafwise, NaNs equal). Leaves are compared smallest first, so a
    loop whose counter moves is told apart after one scalar comparison."""
    a_leaves, b_leaves = _leaves(a), _leaves(b)
    order = sorted(range(len(a_leaves)), key=lambda i: getattr(a_leaves[i], "size", 0))
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
    if "branch_computations" in inst.attrs:
        branches = inst.attrs["branch_computations"]
        index = int(selector)
        if not 0 <= index < len(branches):
            index = len(branches) - 1
        return ctx.call(branches[index].name, [args[index + 1]])
    if selector:
        return ctx.call(inst.attrs["true_computation"].name, [args[1]])
    return ctx.call(inst.attrs["false_computation"].name, [args[2]])


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
