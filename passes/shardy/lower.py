"""The Shardy-only constructs of a JAX dump, in the form the partitioner (and GSPMD's
propagation) reads.

* A shard_map (`xla.sdy.GlobalToLocalShape` -> `call` of `xla.sdy.manual_computation_body*` ->
  `xla.sdy.LocalToGlobalShape`) becomes XLA's GSPMD form: per operand a `Sharding` custom-call
  with the in-sharding and an `SPMDFullToShardShape` to the local shape (manual over the manual
  axes), the body inlined, per result a `Sharding` (manual) and an `SPMDShardToFullShape` with the
  out-sharding.
* `xla.sdy.FuncResultSharding(x)` is `x` returned with that sharding: the entry's root takes it.
* `xla.sdy.ShardingGroup(x)` (group g) becomes `Sharding(x) {unknown shard_as g}` read by x's
  later users, GSPMD's form of `shard_alike`.
* A sharding constraint with open dimensions gets `backend_config="unspecified_dims=[...]"`.

`ShardyToGspmd` (pass `shardy-to-gspmd`) applies all of it with the shardings as written, before
GSPMD's propagation; Shardy's `export` applies the first two with the propagated ones.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.errors import UnsupportedError
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.module import Computation, Instruction, Module
from gspmdc.ir.sdy import (
    FUNC_RESULT_SHARDING, GLOBAL_TO_LOCAL, IN_SHARDINGS, LOCAL_TO_GLOBAL, MANUAL_AXES,
    OUT_SHARDINGS, PREFIX, SHARDING_GROUP, SHARDING_GROUP_ID, frontend,
    instruction_shardings, module_meshes, resolve_mesh,
)
from gspmdc.ir.sdy_hlo import to_hlo
from gspmdc.ir.sharding import HloSharding, ShardGroup
from gspmdc.ir.stage import Stage
from gspmdc.passes.pass_manager import ModulePass, PassContext

__all__ = ["ManualCall", "manual_calls", "lower_manual_call", "return_with_result_shardings",
           "ShardyToGspmd", "target", "erase_axes"]


def target(inst: Instruction) -> str | None:
    return inst.attrs.get("custom_call_target") if inst.opcode == "custom-call" else None


def erase_axes(sharding, names):
    """The Shardy sharding without the (sub-)axes of the named mesh axes."""
    from gspmdc.ir.sdy import DimSharding, TensorSharding
    names = set(names)

    def keep(axes):
        return tuple(a for a in axes if a.name not in names)

    return TensorSharding(sharding.mesh, tuple(DimSharding(keep(d.axes), d.closed, d.priority)
                                               for d in sharding.dims),
                          keep(sharding.replicated), keep(sharding.unreduced))


@dataclass(eq=False)
class ManualCall:
    """One shard_map in the Shardy round-trip form."""

    computation: Computation        # where it is
    global_to_local: Instruction
    call: Instruction
    local_to_global: Instruction
    body: Computation
    manual_axes: tuple[str, ...]


def _reads(inst: Instruction, producer: Instruction) -> bool:
    return any(o is producer or (o.opcode == "get-tuple-element" and o.operands[0] is producer)
               for o in inst.operands)


def manual_calls(module: Module, comp: Computation) -> list[ManualCall]:
    """The shard_maps of `comp`, checked to be in JAX's form (UnsupportedError otherwise)."""
    found = []
    for g2l in comp.instructions:
        if target(g2l) != GLOBAL_TO_LOCAL:
            continue
        attrs = frontend(g2l)
        calls = [i for i in comp.instructions if i.opcode == "call" and _reads(i, g2l)]
        if len(calls) != 1:
            raise UnsupportedError(f"{g2l.name}: expected one call of a manual computation body "
                                   f"reading it, found {len(calls)}")
        call = calls[0]
        l2gs = [i for i in comp.instructions if target(i) == LOCAL_TO_GLOBAL and _reads(i, call)]
        if len(l2gs) != 1:
            raise UnsupportedError(f"{call.name}: expected one {LOCAL_TO_GLOBAL} of the manual "
                                   f"computation's results, found {len(l2gs)}")
        locals_ = [o for o in call.operands]
        expected = [g2l] if not g2l.shape.is_tuple else None
        if expected is not None and locals_ != expected or expected is None and any(
                o.opcode != "get-tuple-element" or o.operands[0] is not g2l or
                o.attrs["index"] != k for k, o in enumerate(locals_)):
            raise UnsupportedError(f"{call.name}: the manual computation body must take the "
                                   f"{GLOBAL_TO_LOCAL} results in order")
        for key in (IN_SHARDINGS, MANUAL_AXES):
            if key not in attrs:
                raise UnsupportedError(f"{g2l.name}: {GLOBAL_TO_LOCAL} without {key}")
        if OUT_SHARDINGS not in frontend(l2gs[0]):
            raise UnsupportedError(f"{l2gs[0].name}: {LOCAL_TO_GLOBAL} without {OUT_SHARDINGS}")
        found.append(ManualCall(comp, g2l, call, l2gs[0],
                                module.computation(call.attrs["to_apply"].name),
                                attrs[MANUAL_AXES].axes))
    return found


def lower_manual_call(module: Module, mc: ManualCall, in_shardings, out_shardings, hlo) -> None:
    """Rewrite `mc` in GSPMD form with the given global in/out Shardy shardings; `hlo(sharding,
    manual_axes)` converts a Shardy sharding (None: none) to an HloSharding."""
    manual = mc.manual_axes
    new: list[Instruction] = []
    mapping: dict[int, Instruction] = {}
    locals_ = list(mc.global_to_local.shape.leaves())
    for j, (operand, sharding) in enumerate(zip(mc.global_to_local.operands, in_shardings)):
        full = Instruction(f"{mc.call.name}.in{j}", "custom-call", operand.shape, [operand],
                           {"custom_call_target": "Sharding"}, sharding=hlo(sharding, ()))
        shard = Instruction(f"{mc.call.name}.local{j}", "custom-call", locals_[j], [full],
                            {"custom_call_target": "SPMDFullToShardShape"},
                            sharding=hlo(erase_axes(sharding, manual), manual))
        new += [full, shard]
        mapping[id(mc.body.parameters[j])] = shard
    for inst in mc.body.instructions:
        if inst.opcode == "parameter":
            continue
        copy = Instruction(inst.name, inst.opcode, inst.shape,
                           [mapping[id(o)] for o in inst.operands], dict(inst.attrs),
                           sharding=inst.sharding, literal=inst.literal)
        mapping[id(inst)] = copy
        new.append(copy)
    root = mapping[id(mc.body.root)]
    roots = [root]
    if root.shape.is_tuple:
        roots = []
        for k, element in enumerate(root.shape.elements):
            sharding = root.sharding.elements[k] if root.sharding is not None and \
                root.sharding.is_tuple else root.sharding
            gte = Instruction(f"{mc.call.name}.result{k}", "get-tuple-element", element, [root],
                              {"index": k}, sharding=sharding)
            new.append(gte)
            roots.append(gte)
    results = list(mc.local_to_global.shape.leaves())
    outputs = []
    for j, (value, sharding) in enumerate(zip(roots, out_shardings)):
        local = Instruction(f"{mc.call.name}.out{j}", "custom-call", value.shape, [value],
                            {"custom_call_target": "Sharding"},
                            sharding=hlo(erase_axes(sharding, manual), manual))
        full = Instruction(f"{mc.call.name}.global{j}", "custom-call", results[j], [local],
                           {"custom_call_target": "SPMDShardToFullShape"},
                           sharding=hlo(sharding, ()))
        new += [local, full]
        outputs.append(full)
    _splice(module, mc, new, outputs)


def _splice(module: Module, mc: ManualCall, new, outputs) -> None:
    comp, l2g = mc.computation, mc.local_to_global
    replaced: dict[int, Instruction] = {}
    if l2g.shape.is_tuple:
        for inst in comp.instructions:
            if inst.opcode == "get-tuple-element" and inst.operands[0] is l2g:
                replaced[id(inst)] = outputs[inst.attrs["index"]]
    else:
        replaced[id(l2g)] = outputs[0]
    dropped = {id(mc.global_to_local), id(mc.call), id(l2g)} | set(replaced) | {
        id(i) for i in comp.instructions if i.opcode == "get-tuple-element" and
        (i.operands[0] is mc.global_to_local or i.operands[0] is mc.call)}
    result = []
    for inst in comp.instructions:
        if inst is l2g:
            result += new
        if id(inst) in dropped:
            continue
        inst.operands = [replaced.get(id(o), o) for o in inst.operands]
        result.append(inst)
    comp.instructions = result
    if id(comp.root) in replaced:
        comp.root = replaced[id(comp.root)]
    if not any(i.opcode == "call" and i.attrs.get("to_apply").name == mc.body.name
               for _, i in module.all_instructions()):
        module.computations.pop(mc.body.name, None)


def return_with_result_shardings(module: Module, results: list[HloSharding | None]) -> None:
    """Drop the FuncResultSharding custom-calls; the entry's root carries `results` (one per
    output leaf; None: no sharding), through a `copy` when its own sharding differs."""
    for comp in module.computations.values():
        for inst in [i for i in comp.instructions if target(i) == FUNC_RESULT_SHARDING]:
            operand = inst.operands[0]
            for user in comp.instructions:
                user.operands = [operand if o is inst else o for o in user.operands]
            if comp.root is inst:
                comp.root = operand
            comp.instructions.remove(inst)
    if all(r is None for r in results):
        return
    entry = module.entry
    root = entry.root
    results = [r if r is not None else HloSharding.replicate() for r in results]
    wanted = HloSharding.tuple(results) if root.shape.is_tuple else results[0]
    if root.sharding == wanted:
        return
    if root.opcode in ("tuple", "get-tuple-element") or root.sharding is None:
        root.sharding = wanted
        return
    copy = Instruction(f"{root.name}.result", "copy", root.shape, [root], sharding=wanted)
    entry.instructions.append(copy)
    entry.root = copy


def _entry_result_shardings(module: Module) -> list:
    """Per output leaf, the HloSharding its FuncResultSharding names (None: none)."""
    from .graph import func_result_sharding
    meshes = module_meshes(module)
    out = []
    for leaf in range(len(list(module.entry.root.shape.leaves()))):
        sharding = func_result_sharding(module.entry.root, leaf)
        out.append(None if sharding is None else
                   to_hlo(sharding, resolve_mesh(sharding, meshes)))
    return out


def _sharding_groups_as_shard_as(comp: Computation) -> None:
    result = []
    replacement: dict[int, Instruction] = {}
    for inst in comp.instructions:
        inst.operands = [replacement.get(id(o), o) for o in inst.operands]
        if target(inst) != SHARDING_GROUP:
            result.append(inst)
            continue
        operand = inst.operands[0]
        group = frontend(inst)[SHARDING_GROUP_ID].group
        marker = Instruction(f"{inst.name}.shard_as", "custom-call", operand.shape, [operand],
                             {"custom_call_target": "Sharding"},
                             sharding=HloSharding.unknown(shard_group=ShardGroup("as", group)))
        replacement[id(operand)] = marker
        result.append(marker)
    comp.instructions = result
    if id(comp.root) in replacement:
        comp.root = replacement[id(comp.root)]


def _open_dims(comp: Computation) -> None:
    for inst in comp.instructions:
        shardings = instruction_shardings(inst) if target(inst) == "Sharding" else None
        if not shardings or "backend_config" in inst.attrs:
            continue
        open_dims = [k for k, d in enumerate(shardings[0].dims) if not d.closed]
        if open_dims:
            inst.attrs["backend_config"] = f"unspecified_dims=[{','.join(map(str, open_dims))}]"


def _hlo_shardings_where_missing(module: Module, hlo) -> None:
    """An instruction with a Shardy sharding and no `sharding=` gets the HloSharding of it
    (JAX writes both; a module written by hand may give only the Shardy one), manual over the
    manual axes inside a shard_map body; the Shardy-only custom-calls are left to the lowering."""
    manual_of = {mc.body.name: mc.manual_axes
                 for comp in list(module.computations.values())
                 for mc in manual_calls(module, comp)}
    for comp in module.computations.values():
        manual = manual_of.get(comp.name, ())
        for inst in comp.instructions:
            shardings = instruction_shardings(inst)
            if inst.sharding is not None or not shardings or any(s is None for s in shardings) \
                    or target(inst) in _LOWERED:
                continue
            hlos = [hlo(erase_axes(s, manual), manual) for s in shardings]
            inst.sharding = HloSharding.tuple(hlos) if inst.shape.is_tuple else hlos[0]


_LOWERED = frozenset({FUNC_RESULT_SHARDING, SHARDING_GROUP, GLOBAL_TO_LOCAL, LOCAL_TO_GLOBAL})


def _drop_sdy_attributes(module: Module) -> None:
    for _, inst in module.all_instructions():
        kv = inst.attrs.get("frontend_attributes")
        if kv is None:
            continue
        items = tuple((k, v) for k, v in kv.items if not k.startswith(PREFIX))
        if items:
            inst.attrs["frontend_attributes"] = KeyValueList(items, kv.separator)
        else:
            del inst.attrs["frontend_attributes"]


@dataclass(frozen=True)
class ShardyToGspmd(ModulePass):
    """The `shardy-to-gspmd` pass: a module in Shardy form in the partitioner's (GSPMD) form,
    with the shardings it carries (nothing to do for other modules). Before GSPMD's propagation
    (`after_propagation` false) sharding groups become `shard_as` markers, open constraint
    dimensions `unspecified_dims`, and the `xla.sdy.*` attributes go; after Shardy's propagation
    groups are dropped and the (propagated) Shardy shardings stay, for dumps and `explain`."""

    name = "shardy-to-gspmd"
    accepts = frozenset({Stage.GLOBAL, Stage.PROPAGATED})
    after_propagation: bool = False

    def apply(self, ctx: PassContext, module: Module) -> Module:
        meshes = module_meshes(module)
        if meshes is None:
            return module

        def hlo(sharding, manual):
            return to_hlo(sharding, resolve_mesh(sharding, meshes), manual)

        if not self.after_propagation:
            _hlo_shardings_where_missing(module, hlo)
        for comp in list(module.computations.values()):
            for mc in manual_calls(module, comp):
                lower_manual_call(module, mc, frontend(mc.global_to_local)[IN_SHARDINGS].shardings,
                                  frontend(mc.local_to_global)[OUT_SHARDINGS].shardings, hlo)
        return_with_result_shardings(module, _entry_result_shardings(module))
        for comp in module.computations.values():
            if self.after_propagation:
                comp.instructions = [i for i in comp.instructions if target(i) != SHARDING_GROUP]
            else:
                _sharding_groups_as_shard_as(comp)
                _open_dims(comp)
        if not self.after_propagation:
            _drop_sdy_attributes(module)
        return module
