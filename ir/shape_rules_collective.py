"""Shape rules of collectives and device ids: all-reduce, all-gather, reduce-scatter, all-to-all
(array and tuple forms), collective-permute, collective-broadcast, partition-id, replica-id.

The group size G of a collective follows XLA's group modes
(docs/design/cost-model.md#who-talks-to-whom), decided by
`channel_id` and `use_global_device_ids`:

| channel_id | use_global_device_ids   | mode                        | G for `{}` | G for group g |
|------------|-------------------------|-----------------------------|------------|---------------|
| absent     | false                   | cross-replica               | R          | len(g)        |
| present    | (op has no such attr.)  | cross-partition             | P          | len(g)        |
| present    | false                   | cross-replica-and-partition | R * P      | len(g) * P    |
| present    | true                    | flattened global ids        | R * P      | len(g)        |

with R = the module's `replica_count` (default 1) and P = its `num_partitions` (unknown when the
header omits it). all-gather multiplies dimension d by G, reduce-scatter divides it by G. When G is
unknown the given result shape is checked for consistency instead (a multiple / a divisor).
"""
from __future__ import annotations

from .attributes import ReplicaGroups
from .module import Instruction, Module
from .ops import SHAPE_RULES, opcodes
from .shape_rules_common import (
    attr_bool, attr_ints, attr_value, called, check_dimension_list, check_reducer, fail,
    given_shape, operand_array, require_same_element_type, strip, tuple_or_single,
)
from .shapes import ArrayShape, Shape, TupleShape

#: collectives that carry `use_global_device_ids` (the others are cross-partition with a channel)
_GLOBAL_ID_OPS = opcodes("all-reduce", "all-gather", "reduce-scatter")
#: collectives whose groups must all have one size (the result shape depends on it)
_EQUAL_GROUP_OPS = opcodes("all-gather", "reduce-scatter", "all-to-all")


def _module_int(module: Module, name: str, default: int | None) -> int | None:
    value = module.attrs.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else default


def group_size(inst: Instruction, module: Module) -> int | None:
    """The number of participants G in each group of a collective (see the module docstring), or
    None when it depends on an unknown partition count or an unmodelled `replica_groups` form."""
    groups = attr_value(inst, "replica_groups", ReplicaGroups(()))
    if not isinstance(groups, ReplicaGroups):
        return None
    has_channel = inst.attrs.get("channel_id") is not None
    global_ids = attr_bool(inst, "use_global_device_ids")
    replicas = _module_int(module, "replica_count", 1)
    partitions = _module_int(module, "num_partitions", None)
    sizes = {len(g) for g in groups.groups}
    if len(sizes) > 1:
        return None
    members = sizes.pop() if sizes else None
    if not has_channel:
        return members if members is not None else replicas
    if inst.opcode not in _GLOBAL_ID_OPS or global_ids:
        if members is not None:
            return members
        return partitions if inst.opcode not in _GLOBAL_ID_OPS else _times(replicas, partitions)
    return _times(members if members is not None else replicas, partitions)


def _times(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a * b


def _check_groups(inst: Instruction) -> None:
    """Global ids need a channel; each id appears in at most one group, once; some ops need
    groups of equal size."""
    has_channel = inst.attrs.get("channel_id") is not None
    if not (has_channel or not attr_bool(inst, "use_global_device_ids")):
        fail("use_global_device_ids=true needs a channel_id")
    groups = inst.attrs.get("replica_groups")
    if not isinstance(groups, ReplicaGroups):
        return
    ids = [i for g in groups.groups for i in g]
    if not (all(i >= 0 for i in ids) and len(set(ids)) == len(ids)):
        fail(f"replica_groups {[list(g) for g in groups.groups]} repeat or contain negative ids")
    if not all(g for g in groups.groups):
        fail("replica_groups contain an empty group")
    if inst.opcode in _EQUAL_GROUP_OPS:
        if not len({len(g) for g in groups.groups}) <= 1:
            fail(f"{inst.opcode} needs replica groups of equal size")


def _operands(inst: Instruction) -> list[ArrayShape]:
    return [operand_array(inst, i) for i in range(len(inst.operands))]


def _check_reduction(inst: Instruction, module: Module, xs: list[ArrayShape]) -> None:
    """The reduction computation is a binary scalar reducer of each operand's element type."""
    for x in xs:
        check_reducer(called(inst, module, "to_apply"), [x.element_type], [x.element_type],
                      "reduction")


@SHAPE_RULES.register("all-reduce")
def all_reduce(inst: Instruction, module: Module) -> Shape:
    """Shapes unchanged; several operands give a tuple."""
    _check_groups(inst)
    xs = _operands(inst)
    _check_reduction(inst, module, xs)
    return tuple_or_single([strip(x) for x in xs])


def _scatter_dimension(inst: Instruction, xs: list[ArrayShape]) -> int:
    dims = attr_ints(inst, "dimensions")
    if len(dims) != 1:
        fail(f"{inst.opcode} needs exactly one dimension, found {list(dims)}")
    for x in xs:
        check_dimension_list(dims, x.rank, f"{inst.opcode} dimension")
    return dims[0]


def _given_results(inst: Instruction, count: int) -> list[ArrayShape]:
    out = given_shape(inst)
    results = list(out.elements) if count > 1 and isinstance(out, TupleShape) else [out]
    if not (len(results) == count and all(isinstance(r, ArrayShape) for r in results)):
        fail(f"{inst.opcode} of {count} operands cannot give {out}")
    return results


def _resize(inst: Instruction, module: Module, grow: bool) -> Shape:
    """all-gather (grow) / reduce-scatter: dimension d multiplied / divided by G."""
    _check_groups(inst)
    xs = _operands(inst)
    d = _scatter_dimension(inst, xs)
    g = group_size(inst, module)
    if g is not None:
        results = []
        for x in xs:
            if not (grow or x.dims[d] % g == 0):
                fail(f"dimension {d} of {x} is not divisible by the "
                     f"group size {g}")
            size = x.dims[d] * g if grow else x.dims[d] // g
            results.append(x.with_dims(x.dims[:d] + (size,) + x.dims[d + 1:]))
        return tuple_or_single(results)
    results = _given_results(inst, len(xs))
    for x, r in zip(xs, results):
        small, big = (x, r) if grow else (r, x)
        if not (r.element_type == x.element_type and r.rank == x.rank
                and all(a == b for k, (a, b) in enumerate(zip(x.dims, r.dims)) if k != d)
                and (big.dims[d] == 0 if small.dims[d] == 0 else big.dims[d] % small.dims[d] == 0)):
            fail(f"{inst.opcode} of {x} along dimension {d} cannot give {r}")
    return tuple_or_single(results)


@SHAPE_RULES.register("all-gather")
def all_gather(inst: Instruction, module: Module) -> Shape:
    return _resize(inst, module, grow=True)


@SHAPE_RULES.register("reduce-scatter")
def reduce_scatter(inst: Instruction, module: Module) -> Shape:
    _check_reduction(inst, module, _operands(inst))
    return _resize(inst, module, grow=False)


@SHAPE_RULES.register("all-to-all")
def all_to_all(inst: Instruction, module: Module) -> Shape:
    """Array form (`dimensions={d}`, one operand): shape unchanged, d divisible by G. Tuple form
    (no dimensions, one operand per group member): the tuple of the operand shapes."""
    _check_groups(inst)
    xs = _operands(inst)
    g = group_size(inst, module)
    if "dimensions" in inst.attrs:
        if len(xs) != 1:
            fail(f"all-to-all with dimensions takes one operand, found {len(xs)}")
        d = _scatter_dimension(inst, xs)
        if not (g is None or xs[0].dims[d] % g == 0):
            fail(f"dimension {d} of {xs[0]} is not divisible by the group size {g}")
        return strip(xs[0])
    if not (g is None or len(xs) == g):
        fail(f"tuple all-to-all needs one operand per group member ({g}), found {len(xs)}")
    require_same_element_type(xs, "all-to-all operands")
    return TupleShape(tuple(strip(x) for x in xs))


@SHAPE_RULES.register("collective-permute")
def collective_permute(inst: Instruction, module: Module) -> Shape:
    """Shape unchanged; every id is at most once a source and at most once a target."""
    x = operand_array(inst, 0)
    pairs = attr_value(inst, "source_target_pairs")
    if not (isinstance(pairs, tuple) and all(
        isinstance(p, tuple) and len(p) == 2 and all(isinstance(i, int) and i >= 0 for i in p)
        for p in pairs)):
        fail(f"source_target_pairs must be {{source,target}} pairs, found {pairs!r}")
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    if len(set(sources)) != len(sources):
        fail(f"collective-permute repeats a source: {sources}")
    if len(set(targets)) != len(targets):
        fail(f"collective-permute repeats a target: {targets}")
    partitions = _module_int(module, "num_partitions", None)
    if inst.attrs.get("channel_id") is not None and partitions is not None:
        if not all(i < partitions for i in sources + targets):
            fail(f"source_target_pairs name a partition >= num_partitions={partitions}")
    return strip(x)


@SHAPE_RULES.register("collective-broadcast")
def collective_broadcast(inst: Instruction, module: Module) -> Shape:
    _check_groups(inst)
    return tuple_or_single([strip(x) for x in _operands(inst)])


@SHAPE_RULES.register("partition-id", "replica-id")
def device_id(inst: Instruction, module: Module) -> Shape:
    return ArrayShape("u32", ())
