"""The options of Shardy's propagation (`ShardyOptions`), apart from the propagation itself so that
naming the pass costs no import of it."""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.errors import ShardingError

STRATEGIES = ("aggressive", "basic", "basic-then-aggressive")


@dataclass(frozen=True)
class ShardyOptions:
    """`strategy`: aggressive (Shardy's default), basic, or basic-then-aggressive;
    `op_priorities`: run the five op-priority rounds (else one round with every op);
    `conservative`: never propagate sub-axes."""

    strategy: str = "aggressive"
    op_priorities: bool = True
    conservative: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ShardingError(f"unknown Shardy strategy {self.strategy!r} (expected one of "
                                f"{', '.join(STRATEGIES)})")
