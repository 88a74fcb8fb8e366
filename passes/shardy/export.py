"""After Shardy's propagation: write the shardings into the module, in both forms.

* every value's sharding is closed (propagation is over); the entry's parameters and outputs keep
  only axes that divide them evenly, and no sub-axes in dimensions propagation chose;
* every instruction gets its Shardy sharding as `xla.sdy.sharding` (so dumps and `explain` speak
  of mesh axes) and the equivalent HloSharding as `sharding=` (inside a shard_map body, manual
  over its manual axes);
* the entry's `xla.sdy.FuncResultSharding` custom-calls and the shard_maps' `xla.sdy.in_shardings`
  / `xla.sdy.out_shardings` take the propagated shardings.

The module stays in Shardy form (it re-parses, and propagates again to the same shardings);
`lower.py` then turns it into the partitioner's form.
"""
from __future__ import annotations

from gspmdc.ir.frontend_attributes import set_frontend_attribute
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.module import Instruction
from gspmdc.ir.sdy import (
    FUNC_RESULT_SHARDING, IN_SHARDINGS, LOCAL_TO_GLOBAL, OUT_SHARDINGS, SHARDING, SHARDING_GROUP, DimSharding, Meshes, Sharding,
    ShardingPerValue, TensorSharding, instruction_shardings,
)
from gspmdc.ir.sdy_hlo import to_hlo
from gspmdc.ir.sharding import HloSharding

from gspmdc.passes.propagation.provenance import OriginStep, Provenance

from .axes import axis, length
from .graph import Graph, func_result_call
from .lower import erase_axes, target

__all__ = ["export"]


def _closed(sharding: TensorSharding | None) -> TensorSharding | None:
    if sharding is None:
        return None
    return sharding.with_dims(DimSharding(d.axes) for d in sharding.dims)


def _evenly(sharding: TensorSharding, dims, mesh: Mesh) -> TensorSharding:
    """Each dimension's longest prefix of axes that divides it evenly."""
    out = []
    for d, size in zip(sharding.dims, dims):
        kept, remaining = [], size
        for a in d.axes:
            n = length(a, mesh)
            g = _gcd(n, remaining)
            if g == n:
                kept.append(a)
                remaining //= g
                continue
            if g > 1:
                kept.append(axis(a.name, a.pre_size, g, mesh))
            break
        out.append(DimSharding(tuple(kept), d.closed, d.priority))
    return sharding.with_dims(out)


def _without_open_sub_axes(sharding: TensorSharding) -> TensorSharding:
    out = []
    for d in sharding.dims:
        axes = list(d.axes)
        if not d.closed:
            axes = axes[:next((k for k, a in enumerate(axes) if a.size is not None), len(axes))]
        out.append(DimSharding(tuple(axes), d.closed, d.priority))
    return sharding.with_dims(out)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


class _Exporter:
    def __init__(self, graph: Graph, meshes: Meshes):
        self.graph, self.meshes, self.module = graph, meshes, graph.module
        self.default_mesh = next((m for _, m in meshes.meshes if isinstance(m, Mesh)), None)

    def mesh(self, sharding: TensorSharding):
        return self.meshes.get(sharding.mesh) if isinstance(sharding.mesh, str) else sharding.mesh

    def hlo(self, sharding: TensorSharding | None, manual=(), rank: int = 0) -> HloSharding | None:
        """The HloSharding of a value of rank `rank` (None: unsharded, which inside a shard_map
        body is still manual)."""
        if sharding is None:
            if not manual:
                return None
            sharding = TensorSharding("", tuple(DimSharding() for _ in range(rank)))
            return to_hlo(sharding, self.default_mesh, manual)
        return to_hlo(_closed(sharding), self.mesh(sharding), manual)

    def io(self, sharding: TensorSharding | None, dims) -> TensorSharding | None:
        if sharding is None or not isinstance(self.mesh(sharding), Mesh):
            return sharding
        return _without_open_sub_axes(_evenly(sharding, dims, self.mesh(sharding)))

    def run(self) -> None:
        graph, module = self.graph, self.module
        for param in module.entry.parameters:
            for view in graph.leaves(param):
                view.slot.sharding = self.io(view.slot.sharding, view.slot.dims)
        for result in graph.func_results:
            result.slot.sharding = self.io(result.slot.sharding, result.slot.dims)
        manual_of: dict[int, tuple[str, ...]] = {}
        for mc in graph.manual:
            for inst in mc.call.body.instructions + [mc.call.global_to_local, mc.call.call]:
                manual_of[id(inst)] = mc.call.manual_axes
        for _, inst in module.all_instructions():
            if (id(inst), 0) in graph.views and target(inst) not in (FUNC_RESULT_SHARDING,
                                                                   LOCAL_TO_GLOBAL):
                self.annotate(inst, manual_of.get(id(inst), ()))
        self.record_provenance(manual_of)
        for mc in graph.manual:
            set_frontend_attribute(mc.call.global_to_local, IN_SHARDINGS, ShardingPerValue(
                tuple(_closed(s.sharding) for s in mc.in_slots)))
            set_frontend_attribute(mc.call.local_to_global, OUT_SHARDINGS, ShardingPerValue(
                tuple(_closed(s.sharding) for s in mc.out_slots)))
        for result in graph.func_results:
            sharding = _closed(result.slot.sharding)
            call = func_result_call(module.entry.root, result.index)
            if call is not None and sharding is not None:
                call, leaf = call
                shardings = list(instruction_shardings(call))
                shardings[leaf] = sharding
                set_frontend_attribute(call, SHARDING, ShardingPerValue(tuple(shardings)))
            elif call is None and sharding is not None and \
                    sharding != _closed(result.returned.get()):
                _return_through_call(module.entry, result.index, sharding)
        for result in graph.func_results:
            found = func_result_call(module.entry.root, result.index)
            if found is not None and not found[0].shape.is_tuple:
                found[0].sharding = self.hlo(result.slot.sharding)

    def record_provenance(self, manual_of) -> None:
        """The slots' histories as the module's provenance (what `explain` reads), also written
        as `sharding_origin` attributes. An instruction standing for another's value (a loop
        body's parameter, a tuple element) points at it."""
        where: dict[int, str] = {}
        for comp in self.module.computations.values():
            for inst in comp.instructions:
                where[id(inst)] = comp.name
        provenance = Provenance()
        for _, inst in self.module.all_instructions():
            if (id(inst), 0) not in self.graph.views or inst.shape.is_tuple or \
                    target(inst) == FUNC_RESULT_SHARDING:
                continue
            slot = self.graph.view(inst).slot
            manual = manual_of.get(id(inst), ())

            def hlo(sharding, manual=manual, rank=inst.shape.rank):
                return self.hlo(erase_axes(sharding, manual), manual, rank)

            def key(source):
                return where[id(source)], source.name

            owner = slot.instruction
            if owner is not inst and owner is not None and id(owner) in where:
                if slot.sharding is not None:
                    provenance.history[key(inst)] = [OriginStep(
                        hlo(slot.sharding), "control flow", inst.opcode,
                        ((key(owner), max(len(slot.history) - 1, 0)),))]
                continue
            for change in slot.history:
                sources = tuple((key(s.instruction), version) for s, version in change.sources
                                if s.instruction is not None and id(s.instruction) in where)
                provenance.history.setdefault(key(inst), []).append(OriginStep(
                    hlo(change.sharding), change.how, change.rule, sources, change.level))
        provenance.write_attributes(self.module)
        self.provenance = provenance

    def annotate(self, inst: Instruction, manual) -> None:
        shardings = [_closed(v.get()) for v in self.graph.leaves(inst)]
        hlos = [self.hlo(s, manual, leaf.rank) for s, leaf in zip(shardings, inst.shape.leaves())]
        if not inst.shape.is_tuple:
            inst.sharding = hlos[0]
        elif all(h is None for h in hlos):
            inst.sharding = None
        else:
            inst.sharding = HloSharding.tuple(
                [h if h is not None else HloSharding.replicate() for h in hlos])
        if inst.opcode in ("tuple", "get-tuple-element") or target(inst) == SHARDING_GROUP or \
                any(s is None for s in shardings) or not shardings:
            set_frontend_attribute(inst, SHARDING, None)
        elif inst.opcode == "parameter" and len(shardings) == 1 and \
                any(p is inst for p in self.module.entry.parameters):
            set_frontend_attribute(inst, SHARDING, Sharding(shardings[0]))
        else:
            set_frontend_attribute(inst, SHARDING, ShardingPerValue(tuple(shardings)))


def _return_through_call(entry, leaf: int, sharding: TensorSharding) -> None:
    """Return output `leaf` through a new FuncResultSharding custom-call (a flat root tuple's
    element, or the root itself)."""
    root = entry.root
    if root.opcode == "tuple" and all(not o.shape.is_tuple for o in root.operands):
        value = root.operands[leaf]
    elif not root.shape.is_tuple:
        value = root
    else:
        return
    call = Instruction(f"{value.name}.result", "custom-call", value.shape, [value],
                       {"custom_call_target": FUNC_RESULT_SHARDING,
                        "custom_call_has_side_effect": True})
    set_frontend_attribute(call, SHARDING, ShardingPerValue((sharding,)))
    entry.instructions.insert(entry.instructions.index(root) + (root is value), call)
    if root is value:
        entry.root = call
    else:
        root.operands[leaf] = call


def export(graph: Graph, meshes: Meshes) -> Provenance:
    """Write the propagated shardings into `graph.module` (see the module docstring); returns
    where each came from."""
    exporter = _Exporter(graph, meshes)
    exporter.run()
    return exporter.provenance
