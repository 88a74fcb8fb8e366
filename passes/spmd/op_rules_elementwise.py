"""Partitioning of elementwise ops (reference §4.7.1): `copy`, `convert`, `compare`, `select`,
`clamp`, every unary and binary arithmetic/logical op, `map`, and `bitcast-convert` between
types of one width (one that changes the width changes the rank and runs replicated).

The op runs on equally sharded operands and produces that sharding; padding stays padding (its
values are unspecified and never read as data). Candidates: the annotated result sharding, and
each operand's own sharding (computing there, then resharding the result, is cheaper when most
operands already agree). Scalar operands of a non-scalar op (`clamp`'s bounds) are replicated.
"""
from __future__ import annotations

from gspmdc.ir.sharding import HloSharding
from gspmdc.ir.shapes import ArrayShape, TupleShape

from .op_rules import DEFAULT_RULE, OpPlan, OpRule, op_rule, without_partials

UNARY = (
    "abs", "ceil", "cbrt", "count-leading-zeros", "cosine", "erf", "exponential", "exponential-minus-one",
    "floor", "imag", "is-finite", "log", "log-plus-one", "logistic", "negate", "not", "popcnt",
    "real", "reduce-precision", "round-nearest-afz", "round-nearest-even", "rsqrt", "sign",
    "sine", "sqrt", "tan", "tanh", "copy", "convert", "bitcast-convert",
)
BINARY = (
    "add", "atan2", "and", "complex", "divide", "maximum", "minimum", "multiply", "or", "power",
    "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract", "xor",
    "compare",
)
OTHER = ("select", "clamp", "map")


@op_rule(*UNARY, *BINARY, *OTHER)
class ElementwiseRule(OpRule):
    def plan(self, inst, ctx):
        if isinstance(inst.shape, TupleShape):
            if inst.opcode == "copy":                  # leaf by leaf: the copy keeps them
                (operand,) = inst.operands
                return OpPlan((operand.sharding,), operand.sharding,
                              "a tuple copy keeps its operand's shardings")
            return DEFAULT_RULE.plan(inst, ctx)
        if inst.opcode == "bitcast-convert" and inst.shape.rank != inst.operands[0].shape.rank:
            return DEFAULT_RULE.plan(inst, ctx)    # a width change adds or drops a dim
        target = without_partials(inst.sharding)
        rank = inst.shape.rank
        scalar = [isinstance(o.shape, ArrayShape) and o.shape.rank == 0 and rank > 0
                  for o in inst.operands]
        candidates = [target]
        for operand, is_scalar in zip(inst.operands, scalar):
            sharding = operand.sharding
            if not is_scalar and sharding not in candidates and sharding == \
                    without_partials(sharding):
                candidates.append(sharding)
        replicated = HloSharding.replicate()
        plans = [OpPlan(tuple(replicated if s else c for s in scalar), c,
                        "elementwise operands share the result's sharding") for c in candidates]
        return ctx.choose(inst, plans)


__all__ = ["ElementwiseRule", "UNARY", "BINARY", "OTHER"]
