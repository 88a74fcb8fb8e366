"""The random modules of `tests/fuzz` in Shardy form (test-only), for the differential check of
Shardy's propagation against XLA's (`python shardy_differential.py --fuzz N --seed S`).

`shardy_text(case)` gives the case's module with a one-axis mesh over its devices and every
HloSharding that has a Shardy form written as one (`passes/shardy/import_gspmd.to_shardy_form`,
what `--propagation shardy` does with a module in GSPMD form); shardings without one (maximal, an
explicit device order that is no reshaping of the mesh) are dropped first. None for the cases
that have no Shardy form: one partition, or manual regions.
"""
from __future__ import annotations

from gspmdc import api
from gspmdc.ir.mesh import Mesh
from gspmdc.ir.sdy_hlo import from_hlo
from gspmdc.passes.shardy.import_gspmd import AXIS, MESH_NAME, to_shardy_form

from fuzz import Case


def _has_shardy_form(sharding, shape, mesh: Mesh) -> bool:
    return all(hlo.kind in ("replicated", "unreduced") or
               (hlo.kind == "tiled" and from_hlo(hlo, mesh, leaf.rank, MESH_NAME) is not None)
               for leaf, hlo in zip(shape.leaves(), sharding.leaf_shardings(shape)))


def shardy_text(case: Case) -> str | None:
    if case.num_partitions < 2 or case.reference_text is not None:
        return None
    module = api.parse(case.text)
    mesh = Mesh([AXIS], [case.num_partitions])
    for _, inst in module.all_instructions():
        if inst.sharding is None:
            continue
        if inst.sharding.has_manual_leaf:
            return None
        if not _has_shardy_form(inst.sharding, inst.shape, mesh):
            inst.sharding = None
    to_shardy_form(module)
    return api.to_text(module)
