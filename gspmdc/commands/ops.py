"""`gspmdc ops`: the opcode catalogue, with how each part of gspmdc handles every opcode."""
from __future__ import annotations

import argparse

from gspmdc.errors import EXIT_OK, UnsupportedError


def cmd_ops(args: argparse.Namespace) -> int:
    """List every HLO opcode gspmdc knows (or the given ones) with how each layer handles it:
    the verifier's shape rule, propagation forward and backward, the partitioner and the
    runtime's kernel (`rule`, the layer's `default`, or `refused` with the reason), and its
    traits."""
    import gspmdc.ir.shape_inference  # noqa: F401  (the shape rules)
    import gspmdc.passes.propagation  # noqa: F401  (the propagation rules)
    import gspmdc.passes.spmd  # noqa: F401  (the partitioning rules)
    import gspmdc.runtime.kernels  # noqa: F401  (the kernels)
    from gspmdc.ir.ops import CATALOGUE, Layer, refusal, support_report
    for name in args.opcode:
        if name not in CATALOGUE:
            raise UnsupportedError(refusal(name, Layer.SHAPE))
    print(support_report(args.opcode or None))
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("ops", help="list the opcodes gspmdc knows and how each part handles them",
                       description=cmd_ops.__doc__)
    p.add_argument("opcode", nargs="*", help="only these opcodes (default: all)")
    p.set_defaults(run=cmd_ops)
