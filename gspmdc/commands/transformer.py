"""`gspmdc transformer`: write the dense Transformer of the paper-scale table as HLO text."""
from __future__ import annotations

import argparse

from gspmdc.commands.arguments import output_file, positive_int
from gspmdc.errors import EXIT_OK, GspmdcError


def cmd_transformer(args: argparse.Namespace) -> int:
    """Write a dense Transformer (the forward pass of LAYERS identical layers, a while loop over
    stacked weights) as HLO text, with the GSPMD paper's 2-D sharding on an X×Y mesh:
    activations split batch over x and width over y, every weight over both axes (see
    docs/paper-scale.md). The result partitions with `gspmdc compile -n X*Y`, and small ones
    run with `gspmdc run --check`."""
    from gspmdc import api
    from gspmdc.transformer import TransformerConfig, transformer_hlo
    x, _, y = args.mesh.partition("x")
    if not (x.isdigit() and y.isdigit()):
        raise GspmdcError(f"--mesh {args.mesh}: expected XxY, e.g. 16x32")
    config = TransformerConfig(args.layers, args.width, args.heads, args.hidden or 4 * args.width,
                               args.batch, args.sequence, int(x), int(y), args.dtype)
    api.write_text(transformer_hlo(config), args.output)
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("transformer", help="write a dense Transformer with the GSPMD paper's 2-D "
                                           "sharding as HLO text",
                       description=cmd_transformer.__doc__)
    p.add_argument("--layers", type=positive_int, default=4, help="layers (default 4)")
    p.add_argument("--width", type=positive_int, default=512, help="model width M (default 512)")
    p.add_argument("--heads", type=positive_int, default=8, help="attention heads (default 8)")
    p.add_argument("--hidden", type=positive_int, default=None,
                   help="feed-forward width H (default 4 x width)")
    p.add_argument("--batch", type=positive_int, default=8, help="batch size B (default 8)")
    p.add_argument("--sequence", type=positive_int, default=128,
                   help="sequence length S (default 128)")
    p.add_argument("--mesh", default="2x4", metavar="XxY", help="the device mesh (default 2x4)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f32", "f16"),
                   help="element type (default bf16)")
    p.add_argument("-o", "--output", type=output_file,
                   help="write the module here instead of stdout")
    p.set_defaults(run=cmd_transformer)
