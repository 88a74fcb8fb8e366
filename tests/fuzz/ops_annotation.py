"""Annotations: sharding constraints (`Sharding` custom-calls, with `unspecified_dims` now and
then), sharding barriers (`ShardBarrierFrom` / `ShardBarrierTo`), the other annotation targets
the runtime knows (identities), and manual regions: a value constrained to a tiled sharding,
entered with `SPMDFullToShardShape` (or Shardy's `xla.sdy.GlobalToLocalShape`), computed on per
device (elementwise ops with `{manual}` shardings) and left with `SPMDShardToFullShape`
(`xla.sdy.LocalToGlobalShape`). The reference form of a region is the same computation on the
global value, the boundaries as copies (elementwise ops commute with tiling)."""
from __future__ import annotations

from . import choices, shardings
from .ops_elementwise import BINARY, UNARY
from .program import Comp
from .values import MAX_BOUND, Arr, Value



def other_targets() -> list[str]:
    """The identity annotations the runtime executes besides sharding constraints and barriers
    (the partitioner runs them replicated), from the catalogue of custom-call targets."""
    from gspmdc.ir.custom_call_targets import ANNOTATIONS
    from .coverage import NOT_GENERATED
    made_elsewhere = {"Sharding", "ShardBarrierFrom", "ShardBarrierTo"}
    return sorted(t for t in ANNOTATIONS
                  if t not in made_elsewhere and f"custom-call:{t}" not in NOT_GENERATED)


def sharding_constraint(c: Comp) -> Value | None:
    src = c.src
    kind = src.weighted([("float", 5), ("int", 2), ("pred", 1)])
    x = choices.operand(c, kind)
    s = shardings.sharding(src, x.shape, c.n)
    attrs = 'custom_call_target="Sharding"'
    if x.arr.rank and src.boolean(0.2):
        dims = src.subset(list(range(x.arr.rank))) or [0]
        attrs += f', backend_config="unspecified_dims=[{",".join(map(str, dims))}]"'
    return c.emit("custom-call", x.shape, "custom-call", [x], attrs, sharding=s, exact=x.exact,
                  bound=x.bound)


def barrier(c: Comp) -> Value | None:
    x = choices.operand(c, c.src.weighted([("float", 3), ("int", 1)]))
    target = c.src.choice(["ShardBarrierFrom", "ShardBarrierTo"])
    return c.emit("custom-call", x.shape, "custom-call", [x],
                  f'custom_call_target="{target}", custom_call_has_side_effect=true',
                  exact=x.exact, bound=x.bound)


def other_annotation(c: Comp) -> Value | None:
    x = choices.operand(c, c.src.weighted([("float", 3), ("int", 1)]))
    target = c.src.choice(other_targets())
    return c.emit("custom-call", x.shape, "custom-call", [x], f'custom_call_target="{target}"',
                  exact=x.exact, bound=x.bound)


def _shard_dims(dims: tuple[int, ...], sharding: str) -> tuple[int, ...]:
    """Per-device dims of a tiled sharding text `{devices=[t0,t1,...]...}` (ceil division)."""
    if not sharding.startswith("{devices=["):
        return dims
    counts = [int(t) for t in sharding[len("{devices=["):sharding.index("]")].split(",")]
    return tuple(-(-d // t) for d, t in zip(dims, counts))


def manual_region(c: Comp) -> Value | None:
    if c.kind != "entry" or c.mb.budget < 6:
        return None
    src = c.src
    x = choices.operand(c, src.weighted([("float", 4), ("int", 1)]), min_rank=1,
                        max_bound=MAX_BOUND)
    full = x.arr
    s = shardings.tiled(src, full.dims, c.n)
    local = full.with_dims(_shard_dims(full.dims, s))
    enter, leave = ("SPMDFullToShardShape", "SPMDShardToFullShape") if src.boolean(0.7) else \
        ("xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape")
    constrained = c.emit("custom-call", full, "custom-call", [x], 'custom_call_target="Sharding"',
                         sharding=s, exact=x.exact, bound=x.bound, keep=False)
    inside = [c.emit("custom-call", local, "custom-call", [constrained],
                     f'custom_call_target="{enter}"', full=full, ref_opcode="copy", ref_attrs="",
                     exact=x.exact, bound=x.bound)]
    for _ in range(src.integer(1, 4)):
        inside.append(_region_op(c, inside, local, full) or inside[-1])
    last = inside[-1]
    marked = c.emit("custom-call", local, "custom-call", [last], 'custom_call_target="Sharding"',
                    full=full, ref_opcode="copy", ref_attrs="", exact=last.exact,
                    bound=last.bound, keep=False)
    return c.emit("custom-call", full, "custom-call", [marked], f'custom_call_target="{leave}"',
                  sharding=s, ref_opcode="copy", ref_attrs="", exact=last.exact,
                  bound=last.bound)


def _region_op(c: Comp, inside: list[Value], local: Arr, full: Arr) -> Value | None:
    """One elementwise op on per-device values (a unary rule, or a binary one with another
    region value or a constant)."""
    src = c.src
    x = src.choice(inside[::-1])
    kind = choices.kind_of(local)
    if src.boolean(0.5):
        rules = [u for u in UNARY if kind in u.kinds and u.guard is None and u.result is None
                 and (x.exact or not u.exact_only) and x.bound <= u.max_bound]
        if not rules:
            return None
        rule = src.choice(rules)
        bound = rule.bound(x.bound)
        return c.emit(rule.opcode, local, rule.opcode, [x], rule.attrs, full=full,
                      exact=x.exact and rule.keeps_exact,
                      bound=bound if bound <= MAX_BOUND else float("inf"))
    rules = [b for b in BINARY if kind in b.kinds and b.guard_lhs is None and
             b.guard_rhs is None and not b.exact_only and b.max_rhs_bound == float("inf")]
    rule = src.choice(rules)
    if src.boolean(0.5) and len(inside) > 1:
        y = src.choice(inside)
    else:
        scalar = c.emit("constant", Arr(local.dtype, ()), "constant",
                        payload="1" if kind != "float" else "0.5", full=Arr(local.dtype, ()),
                        bound=1.0, keep=False)
        y = c.emit("broadcast", local, "broadcast", [scalar], "dimensions={}", full=full,
                   bound=1.0, keep=False)
    bound = rule.bound(x.bound, y.bound)
    if kind == "float" and bound > MAX_BOUND:
        return None
    return c.emit(rule.opcode, local, rule.opcode, [x, y], full=full, exact=x.exact and y.exact,
                  bound=bound if bound <= MAX_BOUND else float("inf"))


GENERATORS = [(sharding_constraint, 3), (barrier, 2), (other_annotation, 3),
              (manual_region, 3)]
