"""A module in GSPMD form (HloShardings only) put in Shardy form, so that Shardy's propagation can
run on it (`--propagation shardy` on a module without `xla.sdy.meshes`).

The mesh is one axis, `devices`, over the devices the module names, in their order; each
HloSharding becomes the Shardy sharding of sub-axes of it that tiles the devices the same way
(`ir/sdy_hlo.from_hlo`), closed, except the `unspecified_dims` of a `Sharding` constraint, which
are open. A sharding that is not a reshaping of the device order (an explicit device list), a
maximal or a manual one has no such form: UnsupportedError names the instruction.
"""
from __future__ import annotations

from gspmdc.errors import UnsupportedError
from gspmdc.ir.attributes import KeyValueList
from gspmdc.ir.frontend_attributes import set_frontend_attribute
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.module import Module
from gspmdc.ir.sdy import (
    MESHES, SHARDING, DimSharding, Meshes, Sharding, ShardingPerValue, TensorSharding,
)
from gspmdc.ir.sdy_hlo import from_hlo


__all__ = ["to_shardy_form", "MESH_NAME", "AXIS"]

MESH_NAME = "mesh"
AXIS = "devices"


def _num_devices(module: Module) -> int:
    largest = 0
    for _, inst in module.all_instructions():
        for leaf in inst.sharding.leaves() if inst.sharding is not None else ():
            if leaf.kind == "tiled":
                largest = max(largest, leaf.tile_assignment.max_device + 1)
    return max(module.num_partitions or 1, largest)


def _unspecified(inst) -> set[int]:
    from gspmdc.passes.propagation.preprocess import unspecified_dims
    if inst.attrs.get("custom_call_target") != "Sharding":
        return set()
    return set(unspecified_dims(inst) or ())


def to_shardy_form(module: Module) -> Meshes:
    """Give `module` (in place) the mesh and the Shardy shardings of its HloShardings; returns
    the module's meshes."""
    n = _num_devices(module)
    if n < 2:
        raise UnsupportedError(f"module {module.name} names no devices to build a mesh from "
                               "(Shardy's propagation needs a mesh)")
    mesh = Mesh([AXIS], [n])
    for _, inst in module.all_instructions():
        if inst.sharding is None:
            continue
        leaves = list(inst.shape.leaves())
        hlo_leaves = inst.sharding.leaf_shardings(inst.shape)
        shardings = []
        open_dims = _unspecified(inst)
        for leaf, hlo in zip(leaves, hlo_leaves):
            sharding = None
            if hlo.kind in ("replicated", "tiled", "unreduced"):
                sharding = from_hlo(hlo, mesh, leaf.rank, MESH_NAME)
            if sharding is None:
                raise UnsupportedError(f"{inst.name}: sharding {hlo.to_text(False)} is not a "
                                       "reshaping of the device order, so it has no Shardy form: "
                                       "use --propagation gspmd")
            shardings.append(sharding.with_dims(
                DimSharding(d.axes, k not in open_dims) for k, d in enumerate(sharding.dims)))
        value = Sharding(shardings[0]) if inst.opcode == "parameter" and len(shardings) == 1 \
            else ShardingPerValue(tuple(shardings))
        set_frontend_attribute(inst, SHARDING, value)
    meshes = Meshes(((MESH_NAME, mesh),))
    header = module.attrs.get("frontend_attributes")
    items = tuple(header.items) if isinstance(header, KeyValueList) else ()
    module.attrs["frontend_attributes"] = KeyValueList(items + ((MESHES, meshes),), ", ")
    return meshes
