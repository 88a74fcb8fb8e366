"""Which operations the partitioner supports (read from the product's own tables, so a new
opcode or custom-call target shows up here by itself) and which ones a module uses.

Names are opcodes, and `custom-call:<target>` for custom-calls."""
from __future__ import annotations

#: supported names the generator does not make, each with the reason
NOT_GENERATED = {
    "parameter": "every module has parameters; not an operation to cover",
    "custom-call:xla.sdy.ShardingGroup": "Shardy's sharding groups are the Shardy import's work "
                                         "(side-effecting: the partitioner refuses it)",
    "stochastic-convert": "not in the generator's tables; tests/test_op_catalogue.py and "
                          "tests/test_kernels_precision.py check it partitioned against "
                          "unpartitioned and against XLA's own results",
    "after-all": "tokens only order host I/O, which no generated module has",
    "infeed": "host I/O: the runtime reads no host, so a generated module's values could not be "
              "compared; tests/test_spmd_io.py checks each partition's shapes by hand",
}


def supported_operations() -> frozenset[str]:
    """Everything the partitioner handles: opcodes and custom-call targets with a partitioning
    rule of their own, and the pure opcodes and custom-call targets the runtime executes that
    its default action runs unpartitioned (replicated), less partition-dependent ones and
    gspmdc's own per-partition forms (`gspmdc.*` targets)."""
    import gspmdc.ir.shape_inference  # noqa: F401  (registers the shape rules)
    import gspmdc.passes.spmd  # noqa: F401  (registers the partitioning rules)
    import gspmdc.runtime.kernels  # noqa: F401  (registers the kernels)
    from gspmdc.ir.ops import KERNELS, PARTITION_DEPENDENT, PARTITION_RULES, SHAPE_RULES
    from gspmdc.runtime.kernels.custom_call import CUSTOM_CALL_TARGETS
    ruled = set(PARTITION_RULES.rules) | {f"custom-call:{t}" for t in PARTITION_RULES.targets}
    default = (set(SHAPE_RULES.rules) & set(KERNELS.rules)) - PARTITION_DEPENDENT - \
        {"custom-call"}
    targets = {f"custom-call:{t}" for t in CUSTOM_CALL_TARGETS if not t.startswith("gspmdc.")}
    return frozenset(ruled | default | targets)


def required_operations() -> frozenset[str]:
    """The supported operations the generator must make."""
    return supported_operations() - set(NOT_GENERATED)


def operations_in(text: str) -> frozenset[str]:
    """The operations a module's text uses (parsed, not verified)."""
    from gspmdc import api
    module = api.parse(text, verify=False)
    names = set()
    for _, inst in module.all_instructions():
        if inst.opcode == "custom-call":
            names.add(f"custom-call:{inst.attr('custom_call_target')}")
        else:
            names.add(inst.opcode)
    return frozenset(names)
