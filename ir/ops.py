"""The opcode catalogue: one immutable record per HLO opcode gspmdc knows, its traits as data, the
groups derived from them, and the per-layer rule tables every layer registers against.

    from gspmdc.ir import ops
    ops.CATALOGUE["add"].traits          # frozenset({Trait.ELEMENTWISE})
    "sine" in ops.ELEMENTWISE_UNARY       # True
    gspmdc ops                           # each opcode with how every layer handles it

An opcode not in `CATALOGUE` is refused by the verifier (UnsupportedError), so no later layer sees
it. Each layer attaches its rules to catalogue opcodes through its `RuleTable` (registering an
opcode the catalogue does not know is an error at import time). One policy per layer for an
opcode without a rule:

| layer                      | table            | an opcode without a rule                      |
|----------------------------|------------------|-----------------------------------------------|
| shape (the verifier)       | `SHAPE_RULES`    | refused; every catalogued opcode has one      |
| propagation, forward       | `FORWARD_RULES`  | the default rule (elementwise merge, else the representative operand's sharding) |
| propagation, backward      | `BACKWARD_RULES` | the default rule (the user's sharding when the shapes match) |
| partitioning               | `PARTITION_RULES`| refused when partition-dependent (`PARTITION_DEPENDENT`, message: `refusal`), else the default action (operands replicated, the op unchanged) |
| runtime kernels            | `KERNELS`        | refused; every catalogued opcode but `parameter` (bound by the interpreter) has one |

`test_op_catalogue.py` checks the table: every catalogued opcode is supported by every layer,
except where the catalogue itself says a layer refuses it (`refusal`).

Adding an elementwise opcode: one `_unary`/`_binary` line below (its operand types and result
type give its shape rule; `rounded=True` when it rounds a floating-point result) and its kernel in
`runtime/kernels/elementwise.py`; propagation (GSPMD's and Shardy's), partitioning, operation
counts and bf16 rounding pick it up from the catalogue (docs/design/adding-an-opcode.md).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gspmdc.errors import UnsupportedError

from . import custom_call_targets, dtypes

if TYPE_CHECKING:
    from .module import Instruction


class Trait(enum.Enum):
    """What an opcode is, as far as some layer cares."""

    #: computes each result element from the operand elements at the same position (XLA's
    #: IsElementwise: unary, binary and ternary ops, `map`, `rng`)
    ELEMENTWISE = "elementwise"
    #: has an effect beyond its result (XLA's HasSideEffectNoRecurse for gspmdc's opcodes)
    SIDE_EFFECT = "side-effecting"
    #: exchanges data with other partitions or replicas
    COLLECTIVE = "collective"
    #: exchanges data with the host (its data does not come from the program's inputs)
    HOST_IO = "host I/O"
    #: reads the id of the device it runs on
    DEVICE_ID = "device id"
    #: orders side effects only (token values)
    TOKEN = "token"
    #: an asynchronous wrapper around a computation
    ASYNC = "async"
    #: reads and advances the evaluation's global random-number state
    RNG_STATE = "rng state"
    #: runs called computations as its body (loops, branches, calls)
    CONTROL_FLOW = "control flow"
    #: rounds its floating-point result: computed in a wider type and rounded back (as XLA:CPU
    #: computes bf16), it can differ from the result computed in its own type
    ROUNDED = "rounded"


class TypeClass(enum.Enum):
    """The element types a typed elementwise op accepts (the value is the error's wording)."""

    NUMERIC = "numeric"
    FLOAT = "floating"
    FLOAT_OR_COMPLEX = "floating or complex"
    SIGNED_FLOAT_OR_COMPLEX = "signed, floating or complex"
    INTEGRAL = "integral"
    INTEGRAL_OR_PRED = "integral or pred"

    def accepts(self, element_type: str) -> bool:
        t = element_type
        if self is TypeClass.NUMERIC:
            return dtypes.is_float(t) or dtypes.is_complex(t) or dtypes.is_integer(t)
        if self is TypeClass.FLOAT:
            return dtypes.is_float(t)
        if self is TypeClass.FLOAT_OR_COMPLEX:
            return dtypes.is_float(t) or dtypes.is_complex(t)
        if self is TypeClass.SIGNED_FLOAT_OR_COMPLEX:
            return dtypes.is_signed(t) or dtypes.is_float(t) or dtypes.is_complex(t)
        if self is TypeClass.INTEGRAL:
            return dtypes.is_integer(t)
        return dtypes.is_integer(t) or t == "pred"


class ResultType(enum.Enum):
    """The element type of a typed elementwise op's result."""

    SAME = "the operands'"
    PRED = "pred"
    #: the component type of a complex operand (f32 for c64), else the operand's
    COMPONENT = "the component type"


@dataclass(frozen=True, slots=True)
class ElementTypes:
    """The typing of an elementwise op whose shape rule is the catalogue's: operands of one
    element type from `operands`, and the result's element type."""

    operands: TypeClass
    result: ResultType = ResultType.SAME


@dataclass(frozen=True, slots=True)
class OpDef:
    """One HLO opcode: its name (XLA's spelling), operand count bounds (`max_operands=None`:
    unbounded), traits, the attributes that name called computations, and for typed elementwise
    ops the element types that give their shape rule."""

    name: str
    min_operands: int
    max_operands: int | None
    traits: frozenset[Trait]
    calls: tuple[str, ...] = ()
    types: ElementTypes | None = None

    @property
    def arity(self) -> int | None:
        """The operand count when it is fixed, else None."""
        return self.min_operands if self.min_operands == self.max_operands else None

    def describe_operands(self) -> str:
        if self.max_operands is None:
            return f"at least {self.min_operands}"
        if self.arity is not None:
            return str(self.arity)
        return f"{self.min_operands} to {self.max_operands}"


def _op(name: str, operands: int | tuple[int, int | None], *traits: Trait,
        calls: tuple[str, ...] = (), types: ElementTypes | None = None) -> OpDef:
    low, high = (operands, operands) if isinstance(operands, int) else operands
    return OpDef(name, low, high, frozenset(traits), calls, types)


def _unary(name: str, operands: TypeClass, result: ResultType = ResultType.SAME, *,
           rounded: bool = False) -> OpDef:
    return _op(name, 1, Trait.ELEMENTWISE, *([Trait.ROUNDED] if rounded else []),
               types=ElementTypes(operands, result))


def _binary(name: str, operands: TypeClass, *, rounded: bool = False) -> OpDef:
    return _op(name, 2, Trait.ELEMENTWISE, *([Trait.ROUNDED] if rounded else []),
               types=ElementTypes(operands))


_E, _T = Trait, TypeClass

_OPS = (
    # ---- elementwise, typed by the catalogue ----
    _unary("negate", _T.NUMERIC),
    _unary("abs", _T.SIGNED_FLOAT_OR_COMPLEX, ResultType.COMPONENT),
    _unary("sign", _T.SIGNED_FLOAT_OR_COMPLEX),
    _unary("not", _T.INTEGRAL_OR_PRED),
    _unary("popcnt", _T.INTEGRAL),
    _unary("count-leading-zeros", _T.INTEGRAL),
    _unary("floor", _T.FLOAT),
    _unary("ceil", _T.FLOAT),
    _unary("round-nearest-afz", _T.FLOAT),
    _unary("round-nearest-even", _T.FLOAT),
    _unary("is-finite", _T.FLOAT, ResultType.PRED),
    _unary("erf", _T.FLOAT, rounded=True),
    _unary("real", _T.FLOAT_OR_COMPLEX, ResultType.COMPONENT),
    _unary("imag", _T.FLOAT_OR_COMPLEX, ResultType.COMPONENT),
    _unary("exponential", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("exponential-minus-one", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("log", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("log-plus-one", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("sqrt", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("rsqrt", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("cbrt", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("tanh", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("logistic", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("sine", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("cosine", _T.FLOAT_OR_COMPLEX, rounded=True),
    _unary("tan", _T.FLOAT_OR_COMPLEX, rounded=True),
    _binary("add", _T.NUMERIC, rounded=True),
    _binary("subtract", _T.NUMERIC, rounded=True),
    _binary("multiply", _T.NUMERIC, rounded=True),
    _binary("divide", _T.NUMERIC, rounded=True),
    _binary("remainder", _T.NUMERIC, rounded=True),
    _binary("power", _T.NUMERIC, rounded=True),
    _binary("maximum", _T.NUMERIC),
    _binary("minimum", _T.NUMERIC),
    _binary("atan2", _T.FLOAT_OR_COMPLEX, rounded=True),
    _binary("and", _T.INTEGRAL_OR_PRED),
    _binary("or", _T.INTEGRAL_OR_PRED),
    _binary("xor", _T.INTEGRAL_OR_PRED),
    _binary("shift-left", _T.INTEGRAL),
    _binary("shift-right-arithmetic", _T.INTEGRAL),
    _binary("shift-right-logical", _T.INTEGRAL),
    # ---- elementwise with a shape rule of their own ----
    _op("reduce-precision", 1, _E.ELEMENTWISE),
    _op("convert", 1, _E.ELEMENTWISE),
    _op("bitcast-convert", 1, _E.ELEMENTWISE),
    _op("copy", 1, _E.ELEMENTWISE),
    _op("complex", 2, _E.ELEMENTWISE),
    _op("compare", 2, _E.ELEMENTWISE),
    _op("stochastic-convert", 2, _E.ELEMENTWISE),
    _op("select", 3, _E.ELEMENTWISE),
    _op("clamp", 3, _E.ELEMENTWISE),
    _op("map", (1, None), _E.ELEMENTWISE, calls=("to_apply",)),
    _op("rng", 2, _E.ELEMENTWISE, _E.SIDE_EFFECT, _E.RNG_STATE),
    # ---- values and data movement ----
    _op("parameter", 0),
    _op("constant", 0),
    _op("iota", 0),
    _op("tuple", (0, None)),
    _op("get-tuple-element", 1),
    _op("domain", 1),
    _op("opt-barrier", 1),
    _op("get-dimension-size", 1),
    _op("broadcast", 1),
    _op("reshape", 1),
    _op("bitcast", 1),
    _op("transpose", 1),
    _op("reverse", 1),
    _op("concatenate", (1, None)),
    _op("slice", 1),
    _op("dynamic-slice", (1, None)),
    _op("dynamic-update-slice", (2, None)),
    _op("pad", 2),
    _op("gather", 2),
    _op("scatter", (3, None), calls=("to_apply",)),
    # ---- contractions and linear algebra ----
    _op("dot", 2),
    _op("ragged-dot", 3),
    _op("convolution", 2),
    _op("fft", 1),
    _op("cholesky", 1),
    _op("triangular-solve", 2),
    # ---- reductions and sorting ----
    _op("reduce", (2, None), calls=("to_apply",)),
    _op("reduce-window", (2, None), calls=("to_apply",)),
    _op("select-and-scatter", 3, calls=("select", "scatter")),
    _op("sort", (1, None), calls=("to_apply",)),
    _op("topk", 1),
    # ---- control flow and calls ----
    _op("while", 1, _E.CONTROL_FLOW, calls=("condition", "body")),
    _op("conditional", (1, None), _E.CONTROL_FLOW,
        calls=("branch_computations", "true_computation", "false_computation")),
    _op("call", (0, None), _E.CONTROL_FLOW, calls=("to_apply",)),
    _op("fusion", (0, None), _E.CONTROL_FLOW, calls=("calls",)),
    _op("custom-call", (0, None), calls=("called_computations",)),
    _op("async-start", (0, None), _E.ASYNC, calls=("calls",)),
    _op("async-update", 1, _E.ASYNC),
    _op("async-done", 1, _E.ASYNC),
    _op("call-start", (0, None), _E.CONTROL_FLOW, calls=("to_apply",)),
    _op("call-done", 1, _E.CONTROL_FLOW),
    # ---- side effects, tokens and random numbers ----
    _op("after-all", (0, None), _E.TOKEN, _E.SIDE_EFFECT),
    _op("add-dependency", 2, _E.TOKEN),
    _op("infeed", 1, _E.HOST_IO, _E.SIDE_EFFECT),
    _op("outfeed", 2, _E.HOST_IO, _E.SIDE_EFFECT),
    _op("send", 2, _E.HOST_IO, _E.SIDE_EFFECT),
    _op("send-done", 1, _E.HOST_IO, _E.SIDE_EFFECT),
    _op("recv", 1, _E.HOST_IO, _E.SIDE_EFFECT),
    _op("recv-done", 1, _E.HOST_IO, _E.SIDE_EFFECT),
    _op("rng-bit-generator", 1),
    _op("rng-get-and-update-state", 0, _E.SIDE_EFFECT, _E.RNG_STATE),
    # ---- collectives and device ids ----
    _op("all-reduce", (1, None), _E.COLLECTIVE, calls=("to_apply",)),
    _op("all-gather", (1, None), _E.COLLECTIVE),
    _op("reduce-scatter", (1, None), _E.COLLECTIVE, calls=("to_apply",)),
    _op("all-to-all", (1, None), _E.COLLECTIVE),
    _op("collective-permute", 1, _E.COLLECTIVE),
    _op("collective-broadcast", (1, None), _E.COLLECTIVE),
    _op("partition-id", 0, _E.DEVICE_ID),
    _op("replica-id", 0, _E.DEVICE_ID),
)

#: opcode -> its record, in the catalogue's order
CATALOGUE: dict[str, OpDef] = {op.name: op for op in _OPS}


def opcodes(*names: str) -> frozenset[str]:
    """The set of the named opcodes; ValueError names any the catalogue does not know (layers
    build their own opcode lists with this, so a misspelt opcode fails at import)."""
    unknown = [n for n in names if n not in CATALOGUE]
    if unknown:
        raise ValueError(f"not in the opcode catalogue: {', '.join(unknown)}")
    return frozenset(names)


def with_trait(*traits: Trait) -> frozenset[str]:
    """The opcodes that have any of `traits`."""
    return frozenset(op.name for op in _OPS if op.traits & set(traits))


# ---- groups ------------------------------------------------------------------------------------

ELEMENTWISE = with_trait(Trait.ELEMENTWISE)
#: elementwise ops computed from the operands' elements alone (no called computation, no random
#: state): their kernels take and return arrays of any one shape (numpy broadcasting)
ELEMENTWISE_PURE = frozenset(n for n in ELEMENTWISE
                             if not CATALOGUE[n].calls and Trait.RNG_STATE not in
                             CATALOGUE[n].traits)
ELEMENTWISE_UNARY = frozenset(n for n in ELEMENTWISE_PURE if CATALOGUE[n].arity == 1)
ELEMENTWISE_BINARY = frozenset(n for n in ELEMENTWISE_PURE if CATALOGUE[n].arity == 2)
ELEMENTWISE_TERNARY = frozenset(n for n in ELEMENTWISE_PURE if CATALOGUE[n].arity == 3)
#: elementwise ops whose shape rule is the catalogue's (`OpDef.types`)
TYPED_ELEMENTWISE = frozenset(op.name for op in _OPS if op.types is not None)
SIDE_EFFECTING = with_trait(Trait.SIDE_EFFECT)
COLLECTIVES = with_trait(Trait.COLLECTIVE)
HOST_IO = with_trait(Trait.HOST_IO)
RNG_STATE = with_trait(Trait.RNG_STATE)
#: opcodes that only a partitioned (SPMD) program or a manual region holds: collectives and
#: `partition-id`
SPMD_ONLY = COLLECTIVES | opcodes("partition-id")
#: opcodes whose meaning depends on the partition, or that talk to the host or other partitions
#: (and `rng-get-and-update-state`, which hands out the global rng state as a value): the
#: partitioner refuses them outside manual regions unless a rule of its own handles them
PARTITION_DEPENDENT = with_trait(Trait.COLLECTIVE, Trait.HOST_IO, Trait.DEVICE_ID, Trait.TOKEN,
                                 Trait.ASYNC) | opcodes("rng-get-and-update-state")
#: every attribute name that refers to called computations
CALLED_COMPUTATION_ATTRIBUTES = frozenset(a for op in _OPS for a in op.calls)


def has_side_effect(inst: Instruction) -> bool:
    """Whether `inst` acts on the world: a side-effecting opcode, or a custom call that declares
    `custom_call_has_side_effect=true` (other custom calls count as functions of their
    operands, as in XLA)."""
    if inst.opcode == "custom-call":
        return bool(inst.attrs.get("custom_call_has_side_effect", False))
    return inst.opcode in SIDE_EFFECTING


# ---- layers and their rule tables ----------------------------------------------------------------

class Layer(enum.Enum):
    """The layers, in pipeline order; the value is the report's column heading."""

    SHAPE = "shape"
    FORWARD = "fwd"
    BACKWARD = "bwd"
    PARTITION = "partition"
    KERNEL = "kernel"


def refusal(opcode: str, layer: Layer) -> str | None:
    """Why `layer` refuses `opcode` by the catalogue's own account, else None (the layer must
    then support it: with a rule, or by its default)."""
    if opcode not in CATALOGUE:
        return f"unknown opcode {opcode} (not in gspmdc's opcode catalogue)"
    if layer is Layer.PARTITION and opcode in PARTITION_DEPENDENT:
        why = next((_PARTITION_REFUSALS[t] for t in _PARTITION_REFUSALS
                    if t in CATALOGUE[opcode].traits), "it hands out the global rng state")
        return f"{opcode} cannot be partitioned ({why})"
    return None


#: why the partitioner refuses an opcode with the trait (outside manual regions)
_PARTITION_REFUSALS = {
    Trait.DEVICE_ID: "its result depends on the partition",
    Trait.COLLECTIVE: "it already talks to other partitions",
    Trait.HOST_IO: "it talks to the host",
    Trait.TOKEN: "its token orders the side effects of the whole program",
    Trait.ASYNC: "gspmdc does not partition inside an async wrapper",
}


class RuleTable:
    """One layer's rules by catalogue opcode (and, for custom-calls, by target).

    `register(*opcodes, targets=...)` decorates a rule (a function, or a class whose instance is
    the rule when `instance=True`); `add(rule, *opcodes, targets=...)` registers a value;
    `targets` are custom-call targets (`custom_call_targets.py`) with a rule of their own. An
    opcode outside the catalogue, a target gspmdc does not know, or a key registered twice raises
    ValueError. `lookup(opcode, target)` is the rule, else the layer's default (`set_default`),
    else UnsupportedError with the catalogue's message."""

    def __init__(self, layer: Layer, elsewhere: frozenset[str] = frozenset()):
        self.layer = layer
        self.rules: dict[str, Any] = {}
        self.targets: dict[str, Any] = {}
        self.default: Any = None
        #: opcodes the layer handles outside its table (no rule needed, none allowed)
        self.elsewhere = elsewhere
        #: opcodes without a rule that `lookup` found the catalogue does not refuse (they take
        #: the default, which is set once; asked for every visit of every elementwise op)
        self._not_refused: set[str] = set()

    def add(self, rule: Any, *opcodes: str, targets: tuple[str, ...] = ()) -> None:
        for key, table in [(o, self.rules) for o in opcodes] + \
                [(t, self.targets) for t in targets]:
            if table is self.rules and key not in CATALOGUE:
                raise ValueError(f"{self.layer.value} rule for {key!r}, which is not in the "
                                 "opcode catalogue")
            if table is self.targets and key not in custom_call_targets.KNOWN:
                raise ValueError(f"{self.layer.value} rule for custom-call target {key!r}, "
                                 "which custom_call_targets.py does not name")
            if key in table or key in self.elsewhere:
                raise ValueError(f"two {self.layer.value} rules for {key!r}")
            table[key] = rule

    def register(self, *opcodes: str, targets: tuple[str, ...] = (),
                 instance: bool = False) -> Callable:
        def decorate(rule):
            self.add(rule() if instance else rule, *opcodes, targets=targets)
            return rule
        return decorate

    def set_default(self, rule: Any) -> None:
        if self.default is not None:
            raise ValueError(f"two default {self.layer.value} rules")
        self.default = rule

    def get(self, opcode: str) -> Any:
        """The opcode's own rule, or None."""
        return self.rules.get(opcode)

    def __contains__(self, opcode: str) -> bool:
        return opcode in self.rules

    def __getitem__(self, opcode: str) -> Any:
        return self.rules[opcode]

    def lookup(self, opcode: str, target: str | None = None) -> Any:
        """The rule of custom-call `target` (when given and registered), else of `opcode`, else
        the default; UnsupportedError when the layer refuses the opcode."""
        rule = self.targets.get(target) if target is not None else None
        rule = self.rules.get(opcode) if rule is None else rule
        if rule is not None:
            return rule
        if opcode in self._not_refused:
            return self.default
        reason = refusal(opcode, self.layer)
        if reason is None and self.default is not None:
            self._not_refused.add(opcode)
            return self.default
        raise UnsupportedError(reason or f"no {self.layer.value} rule for {opcode}")

    def support(self, opcode: str) -> str:
        """How this layer handles `opcode`: `rule`, `default`, `elsewhere` or `refused`."""
        if opcode in self.rules:
            return "rule"
        if opcode in self.elsewhere:
            return "elsewhere"
        if refusal(opcode, self.layer) is None and self.default is not None:
            return "default"
        return "refused"


SHAPE_RULES = RuleTable(Layer.SHAPE)
FORWARD_RULES = RuleTable(Layer.FORWARD)
BACKWARD_RULES = RuleTable(Layer.BACKWARD)
PARTITION_RULES = RuleTable(Layer.PARTITION)
#: the interpreter binds parameters to the values it is called with
KERNELS = RuleTable(Layer.KERNEL, elsewhere=opcodes("parameter"))
TABLES = {t.layer: t for t in (SHAPE_RULES, FORWARD_RULES, BACKWARD_RULES, PARTITION_RULES,
                               KERNELS)}


# ---- the support report ------------------------------------------------------------------------

def support_report(names: Sequence[str] | None = None) -> str:
    """Each catalogued opcode (or those of `names`: the verifier accepts them all) with how every
    layer handles it (`rule`: a rule of its own; `default`: the layer's default rule; `elsewhere`: outside the table;
    `refused`: with the catalogue's reason, listed below the table) and its traits, then the
    custom-call targets with a partition rule of their own. The columns of the layers above `ir`
    are filled once those layers are loaded (`gspmdc ops` loads them)."""
    names = list(CATALOGUE) if names is None else list(names)
    width = max(len(n) for n in names) + 2
    lines = [f"{'opcode':<{width}}{'verify':<8}" + "".join(f"{layer.value:<11}" for layer in Layer)
             + "traits"]
    reasons = []
    for name in names:
        cells = []
        for layer, table in TABLES.items():
            cells.append(table.support(name))
            if cells[-1] == "refused":
                reason = refusal(name, layer) or "NOT STATED BY THE CATALOGUE (an inconsistency)"
                reasons.append(f"  {name} ({layer.value}): {reason}")
        traits = ", ".join(sorted(t.value for t in CATALOGUE[name].traits))
        lines.append(f"{name:<{width}}{'yes':<8}" + "".join(f"{c:<11}" for c in cells) + traits)
    if reasons:
        lines += ["", "refused, by the catalogue's account:"] + reasons
    lines += ["", "custom-call targets with a partition rule of their own: "
              + ", ".join(sorted(PARTITION_RULES.targets))]
    return "\n".join(lines)
