"""The SPMD partitioner's passes and op rules: from a module with shardings to one program per
partition. The pipeline that runs them is `gspmdc.passes.pipeline`.

Up to `halo-exchange` the IR is the ordinary global program (global shapes, shardings, reshard
nodes as `Sharding` custom-calls, masks as identity ops), so every dump re-parses and evaluates to
the original result; `lower-spmd` rewrites shapes to per-partition ones. Windowed ops keep
their windowed dims tiled and exchange halos with their neighbours (`halo.py`). Loop bodies,
conditions, branches and called computations are partitioned with their call sites' shardings at
their boundary (`call_graph.py`, `op_rules_control.py`); manual regions run per device unchanged
(`op_rules_manual.py`); pure ops without a rule run replicated (the default action).
"""
from __future__ import annotations

from .cleanup import Cleanup
from .explain import collective_result_bytes, explain_collective
from .halo_exchange import HaloExchange
from .inline_calls import InlineCalls
from .insert_reshards import InsertReshards
from .lower_spmd import LowerSpmd
from .pad_uneven import PadUneven
from .windowed_einsum import WindowedEinsum

__all__ = ["Cleanup", "HaloExchange", "InlineCalls", "InsertReshards", "LowerSpmd", "PadUneven",
           "WindowedEinsum", "explain_collective", "collective_result_bytes"]
