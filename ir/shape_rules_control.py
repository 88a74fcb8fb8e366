"""Shape rules of control flow and calls: while, conditional, call, fusion, custom-call and the
async wrappers (`call-start`/`async-start`, `async-update`, `call-done`/`async-done`).

A called computation's parameters must be compatible with the values passed to it; its root is the
call's result.
"""
from __future__ import annotations

from . import custom_call_targets as targets
from . import sdy
from .module import Instruction, Module
from .ops import SHAPE_RULES
from .shape_rules_common import (
    called, called_list, check_call_signature, fail, given_shape, given_tuple, operand_array,
    operand_shape, strip,
)
from .shapes import ArrayShape, Shape, TupleShape, compatible


def _operand_shapes(inst: Instruction) -> list[Shape]:
    return [strip(operand_shape(inst, i)) for i in range(len(inst.operands))]


@SHAPE_RULES.register("while")
def while_(inst: Instruction, module: Module) -> Shape:
    """while(init): condition (state) -> pred[], body (state) -> state; the result is the state."""
    state = strip(operand_shape(inst, 0))
    cond, body = called(inst, module, "condition"), called(inst, module, "body")
    verdict = check_call_signature(cond, [state], "condition")
    if verdict != ArrayShape("pred", ()):
        fail(f"condition {cond.name} must return pred[], returns {verdict}")
    result = check_call_signature(body, [state], "body")
    if not compatible(result, state):
        fail(f"body {body.name} returns {result}, but the loop state is {state}")
    return state


@SHAPE_RULES.register("conditional")
def conditional(inst: Instruction, module: Module) -> Shape:
    """conditional(selector, arg_1..arg_B): pred[] selector with true_computation/false_computation
    (B = 2), or s32[] selector with branch_computations (B >= 1); branch k takes arg_(k+1); every
    branch returns the same shape, the result."""
    selector = operand_array(inst, 0)
    if "branch_computations" in inst.attrs:
        branches = called_list(inst, module, "branch_computations")
        if selector.without_layout() != ArrayShape("s32", ()):
            fail(f"branch index must be s32[], found {selector}")
        if not len(branches) >= 1:
            fail("conditional needs at least one branch")
    else:
        branches = [called(inst, module, "true_computation"),
                    called(inst, module, "false_computation")]
        if selector.without_layout() != ArrayShape("pred", ()):
            fail(f"predicate must be pred[], found {selector}")
    args = _operand_shapes(inst)[1:]
    if len(args) != len(branches):
        fail(f"conditional has {len(branches)} branches but {len(args)} branch operands")
    results = [check_call_signature(b, [a], "branch") for b, a in zip(branches, args)]
    for branch, result in zip(branches[1:], results[1:]):
        if not compatible(result, results[0]):
            fail(f"branch {branch.name} returns {result}, "
                 f"branch {branches[0].name} returns {results[0]}")
    return results[0]


@SHAPE_RULES.register("call")
def call(inst: Instruction, module: Module) -> Shape:
    return check_call_signature(called(inst, module, "to_apply"), _operand_shapes(inst), "callee")


@SHAPE_RULES.register("fusion")
def fusion(inst: Instruction, module: Module) -> Shape:
    return check_call_signature(called(inst, module, "calls"), _operand_shapes(inst),
                                "fused computation")


#: custom-call targets that take exactly one operand: annotations of a value (whose result has
#: the operand's shape) and ops on one value (GSPMD's manual region boundaries, TopK). Shardy's
#: boundaries (`xla.sdy.GlobalToLocalShape` / `LocalToGlobalShape`) take every value entering or
#: leaving a shard_map at once, so any number of operands.
_ANNOTATIONS = frozenset({targets.SHARDING}) | targets.BARRIERS
_ONE_OPERAND = _ANNOTATIONS | {targets.FULL_TO_SHARD, targets.SHARD_TO_FULL, targets.TOPK}
_SOME_OPERANDS = frozenset({targets.SDY_GLOBAL_TO_LOCAL, targets.SDY_LOCAL_TO_GLOBAL})


@SHAPE_RULES.register("custom-call")
def custom_call(inst: Instruction, module: Module) -> Shape:
    """Opaque: the shape is declared; the targets gspmdc gives a meaning take one operand, and
    a sharding constraint or barrier has its operand's shape."""
    shape = given_shape(inst)
    target = inst.attr("custom_call_target")
    if not (target is None or isinstance(target, str)):
        fail(f"custom_call_target must be a string, found {getattr(target, 'text', target)}")
    if target in _ONE_OPERAND:
        if len(inst.operands) != 1:
            fail(f"custom-call {target} takes 1 operand, found {len(inst.operands)}")
    if target == targets.SDY_FUNC_RESULT_SHARDING and sdy.module_meshes(module) is not None:
        # in a Shardy module it names the entry result's sharding; elsewhere (as for XLA's
        # GSPMD partitioner) it is an identity annotation
        if sdy.SHARDING not in sdy.frontend(inst):
            fail(f"custom-call {target} needs its {sdy.SHARDING} frontend attribute")
    if target in _SOME_OPERANDS:
        if not len(inst.operands) >= 1:
            fail(f"custom-call {target} takes at least 1 operand, found 0")
    if target in _ANNOTATIONS:
        if not compatible(strip(operand_shape(inst, 0)), shape):
            fail(f"custom-call {target} must have its operand's shape "
                 f"{strip(operand_shape(inst, 0))}, found {shape}")
    return shape


@SHAPE_RULES.register("async-start", "call-start")
def async_start(inst: Instruction, module: Module) -> Shape:
    """Given shape ((operands...), result, context...): element 0 is the operand tuple, element 1
    the wrapped computation's result (`calls=`, or `to_apply=` in the `call-start` spelling)."""
    attr = "calls" if "calls" in inst.attrs else "to_apply"
    result = check_call_signature(called(inst, module, attr), _operand_shapes(inst),
                                  "async computation")
    out = given_tuple(inst)
    if not len(out.elements) >= 2:
        fail(f"{inst.opcode} result must be ((operands), result, "
             f"context...), found {out}")
    if not compatible(out.elements[0], TupleShape(tuple(_operand_shapes(inst)))):
        fail(f"{inst.opcode} result element 0 {out.elements[0]} must be the operand tuple")
    if not compatible(out.elements[1], result):
        fail(f"{inst.opcode} result element 1 "
             f"{out.elements[1]} must be the async computation's result {result}")
    return out


def _async_state(inst: Instruction) -> TupleShape:
    state = operand_shape(inst, 0)
    if not (isinstance(state, TupleShape) and len(state.elements) >= 2):
        fail(f"{inst.opcode} operand must be an async start's ((operands), result, context...), "
             f"found {state}")
    return state


@SHAPE_RULES.register("async-update")
def async_update(inst: Instruction, module: Module) -> Shape:
    return strip(_async_state(inst))


@SHAPE_RULES.register("async-done", "call-done")
def async_done(inst: Instruction, module: Module) -> Shape:
    """The wrapped computation's result: element 1 of the async state."""
    return strip(_async_state(inst).elements[1])
