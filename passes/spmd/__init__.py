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

from . import (  # noqa: F401  (each module registers its rules)
    op_rules_data, op_rules_dot, op_rules_elementwise, op_rules_passthrough, op_rules_reduce,
)
from . import op_rules_gather  # noqa: F401  (gather)
from . import op_rules_random  # noqa: F401  (rng, rng-bit-generator)
from . import op_rules_indexed  # noqa: F401  (dynamic-(update-)slice, sort, TopK)
from . import op_rules_ragged  # noqa: F401  (ragged-dot)
from . import op_rules_control, op_rules_manual  # noqa: F401  (control flow; manual regions)
from . import op_rules_window  # noqa: F401  (reduce-window, pad, slice, concatenate, reverse)
from . import op_rules_conv  # noqa: F401  (convolution)
from .cleanup import Cleanup
from .explain import collective_result_bytes, collective_sent_bytes, explain_collective
from .halo_exchange import HaloExchange
from .inline_calls import InlineCalls
from .insert_reshards import InsertReshards
from .lower_spmd import LowerSpmd
from .pad_uneven import PadUneven
from .windowed_einsum import WindowedEinsum

__all__ = ["Cleanup", "HaloExchange", "InlineCalls", "InsertReshards", "LowerSpmd", "PadUneven",
           "WindowedEinsum", "explain_collective", "collective_sent_bytes",
           "collective_result_bytes"]
