"""Control flow: call, fusion, while, conditional and the call-start/call-done async pair.

Semantics are XLA's:
- `call(args), to_apply=c` and `fusion(args), calls=c` evaluate `c` on the operands;
- `while(init), condition=c, body=b`: `state = init; while c(state): state = b(state)`;
- `conditional(p, a, b)` with a `pred[]` selector runs `true_computation(a)` or
  `false_computation(b)`; with an `s32[]` index it runs `branch_computations[i]` on operand `i + 1`,
  and an index outside `[0, N)` runs the last branch;
- `call-start` evaluates its `to_apply` computation and yields the async tuple
  `((operands...), result, context...)` with zero contexts; `call-done` returns its result element.
"""
from __future__ import annotations

import numpy as np

from gspmdc.ir import dtypes

from . import kernel


@kernel("call")
def _call(inst, args, ctx):
    return ctx.call(inst.attrs["to_apply"].name, args)


@kernel("fusion")
def _fusion(inst, args, ctx):
    return ctx.call(inst.attrs["calls"].name, args)


@kernel("while")
def _while(inst, args, ctx):
    condition, body = inst.attrs["condition"].name, inst.attrs["body"].name
    state = args[0]
    while ctx.call(condition, [state]):
        state = ctx.call(body, [state])
    return state


@kernel("conditional")
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


@kernel("call-start")
def _call_start(inst, args, ctx):
    result = ctx.call(inst.attrs["to_apply"].name, args)
    contexts = tuple(np.zeros(s.dims, dtypes.numpy_dtype(s.element_type))
                     for s in inst.shape.elements[2:])
    return (tuple(args), result) + contexts


@kernel("call-done")
def _call_done(inst, args, ctx):
    return args[0][1]
