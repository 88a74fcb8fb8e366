"""Shape rules of side-effecting ops: tokens (after-all), host I/O (infeed, outfeed, send,
send-done, recv, recv-done) and random numbers (rng, rng-bit-generator, rng-get-and-update-state).

Token plumbing follows XLA: infeed gives `(data, token[])`; send gives `(data, u32[] context,
token[])` and send-done `token[]`; recv gives `(data, u32[], token[])` and recv-done
`(data, token[])`.
"""
from __future__ import annotations

from . import dtypes
from .module import Instruction, Module
from .ops import SHAPE_RULES
from .shape_rules_common import (
    attr_ident, fail, given_array, given_shape, given_tuple, operand_array, operand_scalar,
    operand_shape, operand_token, require_same_element_type, strip,
)
from .shapes import ArrayShape, Shape, TupleShape, compatible

TOKEN = ArrayShape("token", ())
_CONTEXT = ArrayShape("u32", ())


@SHAPE_RULES.register("after-all")
def after_all(inst: Instruction, module: Module) -> Shape:
    for i in range(len(inst.operands)):
        operand_token(inst, i)
    return TOKEN


@SHAPE_RULES.register("infeed")
def infeed(inst: Instruction, module: Module) -> Shape:
    """infeed(token): given `(data, token[])`."""
    operand_token(inst, 0)
    out = given_tuple(inst, 2)
    if out.elements[1] != TOKEN:
        fail(f"infeed result must end in token[], found {out}")
    return out


@SHAPE_RULES.register("outfeed")
def outfeed(inst: Instruction, module: Module) -> Shape:
    """outfeed(data, token) -> token[]; `outfeed_shape`, when typed as a shape, is the data's."""
    data = operand_shape(inst, 0)
    operand_token(inst, 1)
    declared = inst.attrs.get("outfeed_shape")
    if isinstance(declared, (ArrayShape, TupleShape)):
        if not compatible(declared, data):
            fail(f"outfeed_shape {declared} differs from the data {data}")
    return TOKEN


@SHAPE_RULES.register("send")
def send(inst: Instruction, module: Module) -> Shape:
    operand_token(inst, 1)
    return TupleShape((strip(operand_shape(inst, 0)), _CONTEXT, TOKEN))


def _transfer_state(inst: Instruction) -> TupleShape:
    state = operand_shape(inst, 0)
    if not (isinstance(state, TupleShape) and len(state.elements) == 3
            and state.elements[2].without_layout() == TOKEN):
        fail(f"{inst.opcode} operand must be a (data, u32[], token[]) transfer, found {state}")
    return state


@SHAPE_RULES.register("send-done")
def send_done(inst: Instruction, module: Module) -> Shape:
    _transfer_state(inst)
    return TOKEN


@SHAPE_RULES.register("recv")
def recv(inst: Instruction, module: Module) -> Shape:
    """recv(token): given `(data, u32[], token[])`."""
    operand_token(inst, 0)
    out = given_tuple(inst, 3)
    if not (out.elements[1] == _CONTEXT and out.elements[2] == TOKEN):
        fail(f"recv result must be (data, u32[], token[]), found {out}")
    return out


@SHAPE_RULES.register("recv-done")
def recv_done(inst: Instruction, module: Module) -> Shape:
    return TupleShape((strip(_transfer_state(inst).elements[0]), TOKEN))


_DISTRIBUTIONS = frozenset({"rng_uniform", "rng_normal"})


@SHAPE_RULES.register("rng")
def rng(inst: Instruction, module: Module) -> Shape:
    """rng(a, b) uniform in [a, b) or rng(mu, sigma) normal: given array of the parameters' type."""
    a, b = operand_scalar(inst, 0), operand_scalar(inst, 1)
    t = require_same_element_type([a, b], "rng parameters")
    distribution = attr_ident(inst, "distribution", _DISTRIBUTIONS)
    if not (distribution == "rng_uniform" or dtypes.is_float(t)):
        fail(f"rng_normal needs floating parameters, found {a}")
    out = given_array(inst)
    if out.element_type != t:
        fail(f"rng result {out} must have the parameters' type {t}")
    return out


@SHAPE_RULES.register("rng-bit-generator")
def rng_bit_generator(inst: Instruction, module: Module) -> Shape:
    """rng-bit-generator(state): given `(new state, bits)` (the state keeps its shape) or, as XLA
    also accepts, the bits array alone; the bits are an unsigned integer array."""
    state = operand_array(inst, 0)
    out = given_shape(inst)
    bits = out
    if isinstance(out, TupleShape):
        if len(out.elements) != 2:
            fail(f"rng-bit-generator gives (state, bits), found {out}")
        new_state, bits = out.elements
        if not compatible(new_state, state):
            fail(f"rng-bit-generator must return the state {state} "
                 f"first, found {new_state}")
    if not (isinstance(bits, ArrayShape) and dtypes.is_unsigned(bits.element_type)):
        fail(f"rng-bit-generator bits must be an unsigned integer array, found {bits}")
    return out


@SHAPE_RULES.register("rng-get-and-update-state")
def rng_get_and_update_state(inst: Instruction, module: Module) -> Shape:
    return ArrayShape("u64", (2,))
