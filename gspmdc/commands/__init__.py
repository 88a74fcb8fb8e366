"""The subcommands of `gspmdc`: one module per command family, each with `register(subparsers)`
adding its subcommands (an argparse parser whose `run` default is `fn(args) -> exit code`)."""
from gspmdc.commands import (
    autoshard, basic, bisect, compile, cost, ops, opt, propagation, report, run, show, transformer,
)

COMMANDS = [
    basic, compile, opt, propagation, autoshard, run, ops, cost, show, bisect, report, transformer,
]
