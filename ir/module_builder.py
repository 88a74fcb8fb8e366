"""The module builder: parse records -> IR `Module`, with the checks that need the whole module.

`ModuleBuilder(text).build(records)` works in three steps:

1. header attributes (typed and checked: `num_partitions`, the `mesh=` header against it, ...),
   then computations and their instructions in order, each operand resolved to an instruction
   defined earlier in the same computation (SSA order), names unique, one ENTRY, one ROOT per
   computation, shardings in the named-mesh notation lowered with the module's mesh;
2. computation references (`to_apply=`, `calls=`, ...) resolved to defined computations;
3. computations visited callee-first (no recursion, nesting within `limits.py`): omitted result
   shapes inferred (`shape_inference.infer_shape`), operand shape prefixes checked, constant
   literals materialised for their (possibly inferred) shapes, signatures checked.

Every problem is a `ParseProblem` at the token it is about (the parser adds the file).
`texts` maps each built instruction (by id) to its record, so later errors can point back at it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from lark import Token

from gspmdc.errors import GspmdcError

from . import dtypes, limits
from .attribute_text import KV_DEFAULT_SEPARATOR
from .attributes import (
    COMPUTATION_ATTRIBUTES, STACK_FRAME_INDEX, ComputationRef, Ident, KeyValueList, Literal,
    RawAttr,
)
from .literal_text import LiteralTextError, parse_array, parse_values
from .module import Computation, Instruction, Module
from .parse_errors import problem_at
from .parse_records import (
    Attr, ComputationText, InstructionText, Lit, ModuleText, Span, Value, Word, name_of,
)
from .sdy import PREFIX as SDY_PREFIX
from .sdy_read import SdyReader
from .shape_text import shape_problem
from .shapes import ArrayShape, Shape, TupleShape, compatible
from .sharding_text import lower_mesh_split

_HEADER_INTS = frozenset({"num_partitions", "replica_count"})
_HEADER_BOOLS = frozenset({"is_scheduled"})
_HEADER_BOOL_LISTS = frozenset({"allow_spmd_sharding_propagation_to_parameters",
                                "allow_spmd_sharding_propagation_to_output"})


class ModuleBuilder:
    """Builds the Module from the parse records (see the module docstring for the steps)."""

    def __init__(self, text: str):
        self.text = text
        self.mesh = None
        self.texts: dict[int, InstructionText] = {}     # id(Instruction) -> its record
        self.sdy = SdyReader(text)

    def raw(self, span: Span) -> RawAttr:
        return RawAttr(self.text[span.start:span.end])

    # ---- step 1: header, computations, instructions --------------------------------------------

    def build(self, records: ModuleText) -> Module:
        attrs = self.header_attrs(records.header)
        if records.frame_index is not None:
            attrs[STACK_FRAME_INDEX] = self.raw(records.frame_index)
        computations, entry = [], None
        names: set[str] = set()
        for comp_text in records.computations:
            name = name_of(comp_text.name)
            if name in names:
                raise problem_at(comp_text.name, f"duplicate computation name '{name}'")
            names.add(name)
            if comp_text.entry is not None:
                if entry is not None:
                    raise problem_at(comp_text.entry, f"second ENTRY computation '{name}' "
                                     f"(the entry is '{entry}')")
                entry = name
            computations.append(self.computation(comp_text))
        entry = entry or computations[-1].name
        module_name = name_of(records.name) if records.name is not None else entry
        module = Module(module_name, computations, entry, attrs)
        module.computations[entry].is_entry = True
        self.check_references(module)
        self.complete_shapes(module, records)
        self.sdy.check(module)
        return module

    def header_attrs(self, header: list) -> dict:
        attrs = {}
        for token, name, value in header:
            if name in attrs:
                raise problem_at(token, f"header attribute '{name}' given twice")
            if name == "mesh":
                self.mesh = attrs[name] = value
                continue
            if name == "frontend_attributes":
                items, separator = value
                attrs[name] = KeyValueList(tuple(
                    (k, self.sdy.header_value(k, v.start, v.end) if k.startswith(SDY_PREFIX) else
                     self.raw(v) if isinstance(v, Span) else v) for k, v in items),
                    separator or ", ")
                continue
            typed = value.typed
            if name in _HEADER_INTS:
                if type(typed) is not int or not 1 <= typed <= limits.MAX_DEVICES:
                    raise problem_at(value.token, f"{name} must be a positive integer (at most "
                                     f"{limits.MAX_DEVICES}, 2^24)")
            elif name in _HEADER_BOOLS:
                if type(typed) is not bool:
                    raise problem_at(value.token, f"{name} must be true or false")
            elif name in _HEADER_BOOL_LISTS:
                if not (type(typed) is bool or (isinstance(typed, tuple)
                                                and all(type(v) is bool for v in typed))):
                    raise problem_at(value.token, f"{name} must be a bool or a list of bools")
            else:
                typed = self.raw(value.span)
            attrs[name] = typed
        mesh, partitions = attrs.get("mesh"), attrs.get("num_partitions")
        if mesh is not None and partitions is not None and mesh.num_devices != partitions:
            token = next(t for t, n, _ in header if n == "mesh")
            raise problem_at(token, f"the mesh has {mesh.num_devices} devices but num_partitions="
                             f"{partitions}")
        return attrs

    def computation(self, comp_text: ComputationText) -> Computation:
        all_names = {name_of(t.name) for t in comp_text.instructions}
        defined: dict[str, Instruction] = {}
        instructions, root = [], None
        for text in comp_text.instructions:
            name = name_of(text.name)
            if name in defined:
                raise problem_at(text.name, f"duplicate instruction name '{name}' in computation "
                                 f"'{name_of(comp_text.name)}'")
            operands = []
            for _, token in text.operands:
                operand = defined.get(name_of(token))
                if operand is None:
                    where = "is defined after its use" if name_of(token) in all_names else \
                        f"is not defined in computation '{name_of(comp_text.name)}'"
                    raise problem_at(token, f"operand '{name_of(token)}' {where}")
                operands.append(operand)
            attrs, sharding = self.instruction_attrs(text)
            inst = Instruction(name, text.opcode.value, text.shape, operands, attrs,
                               sharding=sharding, parameter_number=text.parameter_number)
            self.texts[id(inst)] = text
            defined[name] = inst
            instructions.append(inst)
            if text.root is not None:
                if root is not None:
                    raise problem_at(text.root, f"second ROOT in computation '{name_of(comp_text.name)}' "
                                     f"(the root is '{root.name}')")
                root = inst
        for inst in instructions:
            for ref in inst.attrs.get("control-predecessors", ()):
                if ref.name not in defined:
                    raise problem_at(self.attr_token(inst, "control-predecessors"),
                                     f"control predecessor '{ref.name}' is not defined in computation "
                                     f"'{name_of(comp_text.name)}'")
        return Computation(name_of(comp_text.name), instructions, root or instructions[-1],
                           execution_thread=comp_text.execution_thread)

    def instruction_attrs(self, text: InstructionText) -> tuple[dict, Any]:
        attrs, sharding = {}, None
        for attr in text.attrs:
            if attr.name in attrs or (attr.name == "sharding" and sharding is not None):
                raise problem_at(attr.token, f"attribute '{attr.name}' given twice")
            if attr.name == "sharding":
                sharding = lower_mesh_split(attr.value, self.mesh)
            else:
                attrs[attr.name] = self.attribute_value(attr)
        return attrs, sharding

    def attribute_value(self, attr: Attr):
        value, name = attr.value, attr.name
        if name in KV_DEFAULT_SEPARATOR:
            items, separator = value
            return KeyValueList(tuple(
                (k, self.sdy.value(k, v.start, v.end) if k.startswith(SDY_PREFIX) else
                 self.raw(v) if isinstance(v, Span) else v) for k, v in items), separator)
        if not isinstance(value, Value):
            return value
        typed = value.typed
        if name in COMPUTATION_ATTRIBUTES:
            return _computation_refs(typed, attr.token)
        if name == "backend_config":
            return typed if isinstance(typed, str) else self.raw(value.span)
        typed = _plain(typed)
        return self.raw(value.span) if typed is None else typed


    def attr_token(self, inst: Instruction, name: str) -> Token:
        text = self.texts[id(inst)]
        return next((a.token for a in text.attrs if a.name == name), text.name)

    # ---- step 2: computation references ------------------------------------------------------

    def check_references(self, module: Module) -> None:
        for _, inst in module.all_instructions():
            for name, value in inst.attrs.items():
                if name not in COMPUTATION_ATTRIBUTES:
                    continue
                for ref in (value if isinstance(value, tuple) else (value,)):
                    if ref.name not in module.computations:
                        raise problem_at(self.attr_token(inst, name),
                                         f"computation '{ref.name}' is not defined")

    # ---- step 3: shapes and literals -------------------------------------------------------------

    def complete_shapes(self, module: Module, records: ModuleText) -> None:
        signatures = {name_of(c.name): c.signature for c in records.computations}
        for comp in self.callee_first(module):
            for inst in comp.instructions:
                text = self.texts[id(inst)]
                if inst.shape is None:
                    inst.shape = self.inferred_shape(inst, module, text)
                for (prefix, token), operand in zip(text.operands, inst.operands):
                    if prefix is not None and not compatible(prefix, operand.shape):
                        raise problem_at(token, f"operand '{operand.name}' has shape {operand.shape}, "
                                         f"not {prefix}")
                if text.literal is not None:
                    inst.literal = _literal(text.literal, inst.shape)
            if signatures[comp.name] is not None:
                _check_signature(comp, signatures[comp.name])

    def inferred_shape(self, inst: Instruction, module: Module, text: InstructionText) -> Shape:
        # imported here: shape inference pulls in every shape rule, needed only for omitted shapes
        from .shape_inference import infer_shape
        try:
            shape = infer_shape(inst, module)
        except GspmdcError as e:
            raise problem_at(text.opcode, f"cannot infer the shape of '{inst.name}' (give it "
                             f"explicitly): {e}") from None
        problem = shape_problem(shape)
        if problem is not None:
            raise problem_at(text.opcode, f"cannot use the shape inferred for '{inst.name}': {problem}")
        return shape

    def callee_first(self, module: Module) -> list[Computation]:
        """The computations, each after those it calls (a depth-first walk with an explicit
        stack). Raises at the call site for a computation that calls itself, and where
        computations nest deeper than `limits.MAX_COMPUTATION_DEPTH` levels."""
        order: list[Computation] = []
        height: dict[str, int] = {}          # levels nested in a computation, itself included
        active: set[str] = set()
        for start in module.computations.values():
            if start.name in height:
                continue
            active.add(start.name)
            stack = [(start, iter(self.calls(start)))]
            while stack:
                comp, pending = stack[-1]
                step = next(pending, None)
                if step is None:
                    stack.pop()
                    active.discard(comp.name)
                    height[comp.name] = 1 + max((height[callee] for _, callee in
                                                 self.calls(comp)), default=0)
                    order.append(comp)
                    continue
                via, callee = step
                if callee in active:
                    raise problem_at(via, f"computation '{callee}' calls itself")
                below = height.get(callee, 1)
                if len(stack) + below > limits.MAX_COMPUTATION_DEPTH:
                    raise problem_at(via, f"calling '{callee}' here nests computations more than "
                                     f"{limits.MAX_COMPUTATION_DEPTH} levels deep (counting "
                                     f"'{start.name}' and every computation down to the "
                                     f"deepest); gspmdc accepts at most "
                                     f"{limits.MAX_COMPUTATION_DEPTH}")
                if callee not in height:
                    active.add(callee)
                    stack.append((module.computations[callee],
                                  iter(self.calls(module.computations[callee]))))
        return order

    def calls(self, comp: Computation) -> list[tuple[Token, str]]:
        """(attribute token, callee name) of every computation `comp` calls."""
        return [(self.attr_token(inst, name), ref.name)
                for inst in comp.instructions for name, value in inst.attrs.items()
                if name in COMPUTATION_ATTRIBUTES
                for ref in (value if isinstance(value, tuple) else (value,))]


def _computation_refs(typed, token: Token):
    if isinstance(typed, Word):
        return ComputationRef(typed.lstrip("%"))
    if isinstance(typed, tuple) and all(isinstance(v, Word) for v in typed):
        return tuple(ComputationRef(v.lstrip("%")) for v in typed)
    raise problem_at(token, "expected a computation name or a {list} of them")


def _plain(typed):
    """The attribute value for a generic typed value: words become Idents; None when the value
    must stay verbatim (floats, `%names`, anything unstructured)."""
    if isinstance(typed, Word):
        return None if typed.startswith("%") else Ident(typed)
    if isinstance(typed, tuple):
        items = tuple(_plain(v) for v in typed)
        return None if any(v is None for v in items) else items
    return typed


def _check_signature(comp: Computation, signature: tuple) -> None:
    """The signature's result must match the root. Its parameter list is informational (as in
    XLA: real dumps do not always keep it exact)."""
    token, _, result = signature
    if not compatible(result, comp.root.shape):
        raise problem_at(token, f"computation '{comp.name}' returns {comp.root.shape}, its signature "
                         f"says {result}")


# ---- literals ---------------------------------------------------------------------------------

def _literal(node: Lit, shape: Shape) -> Literal:
    """The Literal written by `node` for an instruction of `shape`."""
    if node.kind == "elided":
        return Literal(elided=True)
    if isinstance(shape, TupleShape):
        if node.kind != "tuple" or len(node.items) != len(shape.elements):
            raise problem_at(node.token, f"expected a tuple literal of {len(shape.elements)} elements "
                             f"for shape {shape}")
        return Literal(elements=tuple(_literal(n, s) for n, s in zip(node.items, shape.elements)))
    element_type = shape.element_type
    if element_type == "token":
        raise problem_at(node.token, "a constant cannot have type token[]")
    try:
        if dtypes.is_complex(element_type):
            return Literal(_complex_array(node, shape))
        if node.kind == "text":
            return Literal(parse_array(node.token.value, element_type, shape.dims))
        leaves = _leaves(node, shape.dims)
        if any(leaf.kind != "text" for leaf in leaves):
            raise problem_at(node.token, f"expected a literal of {element_type} values")
        tokens = np.array([leaf.token.value for leaf in leaves], dtype=str)
        return Literal(parse_values(tokens, element_type).reshape(shape.dims))
    except LiteralTextError as e:
        raise problem_at(node.token, f"{e}") from None


def _leaves(node: Lit, dims: tuple[int, ...]) -> list[Lit]:
    """The element nodes of a structured array literal, checked against `dims` level by level."""
    if not dims:
        if node.kind not in ("text", "tuple"):
            raise problem_at(node.token, "expected a literal element")
        return [node]
    if node.kind != "list" or len(node.items) != dims[0]:
        found = f"{len(node.items)} elements" if node.kind == "list" else "a single value"
        raise problem_at(node.token, f"expected {{...}} with {dims[0]} elements, found {found}")
    leaves = []
    for item in node.items:
        leaves.extend(_leaves(item, dims[1:]))
    return leaves


def _complex_array(node: Lit, shape: ArrayShape) -> np.ndarray:
    part = "f32" if shape.element_type == "c64" else "f64"
    pairs = _leaves(node, shape.dims)
    for pair in pairs:
        if pair.kind != "tuple" or len(pair.items) != 2 or \
                any(p.kind != "text" for p in pair.items):
            raise problem_at(pair.token, "expected a complex number (real, imaginary)")
    real = parse_values(np.array([p.items[0].token.value for p in pairs], dtype=str), part)
    imag = parse_values(np.array([p.items[1].token.value for p in pairs], dtype=str), part)
    value = real.astype(dtypes.numpy_dtype(shape.element_type))
    value.imag = imag
    return value.reshape(shape.dims)
