"""The grammar's callbacks: one method per rule of `grammar.lark`, building parse records.

lark calls these while it parses (LALR, `transformer=` in `parser.py`), so no parse tree is
built: each method receives its rule's children (tokens, or what the callbacks of sub-rules
returned) and returns records (`parse_records.py`) and typed attribute values. Problems found
in one rule's text (an invalid sharding, a malformed window) are raised as located
`ParseProblem`s; problems that need the whole module (undefined names, shapes) are the module
builder's.
"""
from __future__ import annotations

from lark import Token, Transformer

from gspmdc.errors import ShardingError

from . import limits
from .attribute_text import (
    KV_DEFAULT_SEPARATOR, KV_ITEM, brace_list, ints, kv_item, scalar, unquote, window,
)
from .attributes import ConvDimLabels, InstructionRef, KeyValueList, PadDim, SliceDim
from .mesh import Mesh
from .parse_errors import ParseProblem, problem_at, token_position
from .parse_records import (
    Attr, ComputationText, InstructionText, Lit, MeshSplit, MeshTuple, ModuleText, Span, Value,
    literal_node, name_of,
)
from .shape_text import ShapeTextError, array_shape, nesting_problem
from .shapes import ArrayShape, TupleShape
from .sharding import HloSharding, ShardGroup
from .sharding_text import explicit_tiles, iota_tiles, replica_groups, single_sharding


class Records(Transformer):
    """LALR callbacks: one method per grammar rule/alias, building records and typed values.
    Stateless (one shared instance serves every parse); positions come from the tokens."""

    # ---- module structure ---------------------------------------------------------------------

    def start(self, children):
        module = ModuleText()
        for child in children:
            if isinstance(child, ComputationText):
                module.computations.append(child)
            elif isinstance(child, Span):
                module.frame_index = child
            else:
                module.name, module.header = child
        return module

    def shape_text(self, children):
        return children[0]

    def sharding_text(self, children):
        return children[0]

    def header(self, children):
        return children[0], children[1:]

    def header_mesh(self, children):
        return children[0], "mesh", children[1]

    def header_kv(self, children):
        token, value = children
        return token, "frontend_attributes", value

    def header_generic(self, children):
        token, value = children
        return token, token.value[:-1], value

    def mesh_spec(self, children):
        brace, axes, device_ids = children[0], children[1:], None
        if len(axes) >= 2 and isinstance(axes[-2], Token):     # `devices=` [ids]
            device_ids, axes = axes[-1], axes[:-2]
        try:
            return Mesh(tuple(a for a, _ in axes), tuple(s for _, s in axes), device_ids)
        except (ShardingError, ValueError) as e:
            raise problem_at(brace, f"invalid mesh: {e}") from None

    def mesh_axis(self, children):
        return children[0].value[:-1], int(children[1])

    def frame_index(self, children):
        return Span(children[0].start, children[-1].end)

    def frame_section(self, children):
        end = children[-1] if len(children) > 1 else children[0].end_pos
        return Span(children[0].start_pos, end)

    def frame_entry(self, children):
        last = children[-1]
        return last.span.end if isinstance(last, Value) else last.end_pos

    def computation(self, children):
        entry = children[0] if children[0].type == "ENTRY" else None
        rest = children[1:] if entry is not None else children
        name, signature, instructions = rest[0], None, []
        thread = None
        for child in rest[1:]:
            if isinstance(child, InstructionText):
                instructions.append(child)
            elif isinstance(child, tuple):
                signature = child
            elif child.type == "ATTR_NAME":
                if child.value != "execution_thread=":
                    raise problem_at(child, f"expected 'execution_thread=' after a computation, "
                                     f"found '{child.value}'")
            else:
                thread = unquote(child.value)
        return ComputationText(entry, name, signature, instructions, thread)

    def signature(self, children):
        return children[0], children[1:-1], children[-1]

    def param(self, children):
        return children[0], children[1]

    def instruction(self, children):
        root = children[0] if children[0].__class__ is Token and children[0].type == "ROOT" else None
        i = 1 if root is not None else 0
        name = children[i]
        shape = children[i + 1] if isinstance(children[i + 1], (ArrayShape, TupleShape)) else None
        op_index = i + 2 if shape is not None else i + 1
        kind, opcode, payload = children[op_index]
        inst = InstructionText(root, name, shape, opcode, [], children[op_index + 1:])
        if kind == "parameter":
            inst.parameter_number = payload
        elif kind == "constant":
            inst.literal = payload
        else:
            inst.operands = payload
        return inst

    def op_parameter(self, children):
        return "parameter", children[0], int(children[1])

    def op_constant(self, children):
        return "constant", children[0], children[1]

    def op_generic(self, children):
        return "op", children[0], children[1:]

    def operand(self, children):
        return (children[0], children[1]) if len(children) == 2 else (None, children[0])

    # ---- shapes -------------------------------------------------------------------------------

    def array_shape(self, children):
        token = children[0]
        try:
            return array_shape(token.value)
        except ShapeTextError as e:
            raise ParseProblem(e.message, *token_position(token, e.offset)) from None

    def tuple_shape(self, children):
        shape = TupleShape(tuple(children[1:]))
        problem = nesting_problem(shape)
        if problem is not None:
            raise problem_at(children[0], problem)
        return shape

    # ---- literals -----------------------------------------------------------------------------

    def constant_literal(self, children):
        return literal_node(children[0])

    def literal_list(self, children):
        return Lit("list", children[0], tuple(literal_node(c) for c in children[1:]))

    def literal_tuple(self, children):
        return Lit("tuple", children[0], tuple(literal_node(c) for c in children[1:]))

    # ---- generic values -----------------------------------------------------------------------

    def value(self, children):
        head = children[0]
        last = children[-1]
        end = last.span.end if isinstance(last, Value) else last.end_pos
        if isinstance(head, Value):
            span = Span(head.span.start, end)
            return Value(head.typed if len(children) == 1 else None, span, head.token,
                          head.depth)
        typed = scalar(head) if len(children) == 1 else None
        return Value(typed, Span(head.start_pos, end), head)

    def group(self, children):
        opening, closing = children[0], children[-1]
        depth = 1 + max((c.depth for c in children if isinstance(c, Value)), default=0)
        typed = brace_list(children[1:-1]) \
            if opening.value == "{" and depth <= limits.MAX_TUPLE_DEPTH else None
        return Value(typed, Span(opening.start_pos, closing.end_pos), opening, depth)

    def int_list(self, children):
        return tuple(int(t) for t in children)

    def kv_list(self, children):
        items, comma = [], False
        for child in children[1:]:
            if isinstance(child, tuple):
                items.append(child)
            else:
                comma = True
        separator = ", " if comma else (" " if len(items) > 1 else None)
        return tuple(items), separator

    def kv_flat(self, children):
        token = children[0]
        items = tuple(kv_item(m.group(1), m.group(2), token.start_pos + m.start(2))
                      for m in KV_ITEM.finditer(token.value))
        comma = "," in KV_ITEM.sub("", token.value)
        return items, ", " if comma else (" " if len(items) > 1 else None)

    def kv(self, children):
        key, value = children
        if isinstance(value, Value):
            return key.value[:-1], value.span
        return kv_item(key.value[:-1], value.value, value.start_pos)

    # ---- attributes ---------------------------------------------------------------------------

    def attr_generic(self, children):
        token, value = children
        return Attr(token.value[:-1], value, value.token)

    def attr_sharding(self, children):
        return Attr("sharding", children[1], children[0])

    def attr_kv(self, children):
        token, (items, separator) = children
        name = token.value[:-1]
        return Attr(name, (items, separator or KV_DEFAULT_SEPARATOR[name]), token)

    def attr_control(self, children):
        refs = tuple(InstructionRef(name_of(t)) for t in children[1:])
        return Attr("control-predecessors", refs, children[0])

    def attr_padding(self, children):
        if len(children) == 1:
            return Attr("padding", (), children[0])
        dims = []
        for part in children[1].value.split("x"):
            numbers = ints(part, "_")
            if len(numbers) == 3 and numbers[2] < 0:
                raise problem_at(children[1], f"interior padding must be non-negative, found {part}")
            dims.append(PadDim(*numbers))
        return Attr("padding", tuple(dims), children[0])

    def attr_dim_labels(self, children):
        token = children[1]
        operands, out = token.value.split("->")
        lhs, rhs = operands.split("_")
        return Attr("dim_labels", ConvDimLabels(lhs, rhs, out), children[0])

    def attr_window(self, children):
        token, fields = children[0], {}
        for key, value in children[1:]:
            if key.value in fields:
                raise problem_at(key, f"window field '{key.value}' given twice")
            fields[key.value] = (key, value)
        return Attr("window", window(token, fields), token)

    def window_field(self, children):
        return children[0], children[1]

    def attr_slice(self, children):
        return Attr("slice", tuple(children[1:]), children[0])

    def slice_dim(self, children):
        return SliceDim(*(int(t) for t in children))

    def attr_replica_groups(self, children):
        token, spec = children
        try:
            return Attr("replica_groups", replica_groups(spec), token)
        except (ValueError, ShardingError) as e:
            raise problem_at(token, f"invalid replica groups: {e}") from None

    def groups_explicit(self, children):
        return "explicit", tuple(children)

    def replica_group(self, children):
        return children[0] if children else ()

    def groups_iota(self, children):
        return ("iota",) + children[0]

    def iota_list(self, children):
        return children[0], children[1], (children[2] if len(children) > 2 else None)

    def groups_mesh(self, children):
        axes = [c for c in children if isinstance(c, tuple) and c[0] == "axis"]
        refs = [c for c in children if isinstance(c, tuple) and c[0] == "ref"]
        ids = next((c for c in children if isinstance(c, tuple) and c[0] == "ids"), None)
        return "mesh", [(a[1], a[2]) for a in axes], ids, [r[1:] for r in refs]

    def mesh_axis_size(self, children):
        return "axis", children[0].value[1:-1], int(children[1])

    def device_ids_iota(self, children):
        return "ids", "iota", children[0], (children[1] if len(children) > 1 else None)

    def device_ids_explicit(self, children):
        return "ids", "explicit", children[0], None

    def axis_ref(self, children):
        name = children[0].value[1:-1]
        if len(children) == 1:
            return "ref", name, None, None
        return "ref", name, int(children[1]), int(children[2])

    # ---- shardings ----------------------------------------------------------------------------

    def sharding_single(self, children):
        brace = children[0]
        try:
            return single_sharding(brace, children[1:])
        except ShardingError as e:
            raise problem_at(brace, f"invalid sharding: {e}") from None

    def sharding_tuple(self, children):
        brace, elements = children[0], tuple(children[1:])
        if any(isinstance(e, MeshTuple) or (isinstance(e, HloSharding) and e.is_tuple)
               for e in elements):
            raise problem_at(brace, "tuple shardings cannot nest")
        if any(isinstance(e, MeshSplit) for e in elements):
            return MeshTuple(elements, brace)
        try:
            return HloSharding.tuple(elements)
        except ShardingError as e:
            raise problem_at(brace, f"invalid sharding: {e}") from None

    def sharding_empty(self, children):
        return HloSharding.tuple(())

    def sharding_device(self, children):
        return "device", int(children[1]), children[0]

    def sharding_explicit(self, children):
        token, dims, ids = children
        try:
            return "tiles", explicit_tiles(dims, ids), token
        except ShardingError as e:
            raise problem_at(token, f"invalid sharding: {e}") from None

    def sharding_iota(self, children):
        token, (dims, reshape_dims, perm) = children
        try:
            return "tiles", iota_tiles(dims, reshape_dims, perm), token
        except ShardingError as e:
            raise problem_at(token, f"invalid sharding: {e}") from None

    def sharding_subgroups(self, children):
        return "subgroups", tuple(t.value for t in children[1:]), children[0]

    def sharding_group(self, children):
        kind = "as" if children[0].type == "SHARD_AS" else "like"
        return "group", ShardGroup(kind, int(children[1])), children[0]

    def sharding_metadata(self, children):
        token = children[0]
        for items, _ in children[1:]:
            if any(isinstance(v, Span) for _, v in items):
                raise problem_at(token, "sharding metadata values must be strings, integers or bools")
        entries = tuple(KeyValueList(items, separator or " ") for items, separator in children[1:])
        return "metadata", entries, token

    def sharding_mesh_split(self, children):
        return "mesh_split", tuple(children[1:]), children[0]

    def mesh_split_dim(self, children):
        names = tuple(name_of(t) for t in children)
        return () if names == ("_",) else names
