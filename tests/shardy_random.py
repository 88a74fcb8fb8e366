"""Random modules in Shardy form (test-only), for the differential check against XLA.

`random_module(seed)` draws a mesh (2 or 3 named axes, or one), a few parameters with Shardy
shardings (some dimensions open, some with priorities, some axes explicitly replicated) or none,
and a chain of ops over them: elementwise, transpose, reshape, broadcast, reduce, dot, slice,
concatenate, pad, sharding constraints (closed or open), a sharding group now and then, and
outputs returned with or without a result sharding. The text is HLO in the form JAX prints: each
Shardy sharding next to its HloSharding.
"""
from __future__ import annotations

import random
from math import prod

from gspmdc import api
from gspmdc.ir.sdy import instruction_shardings, module_meshes, resolve_mesh
from gspmdc.ir.sdy_hlo import to_hlo

from hlo_text import reducer

MESHES = [(("x", 2), ("y", 4)), (("x", 2), ("y", 2), ("z", 2)), (("a", 8),), (("x", 4), ("y", 2))]
SIZES = (2, 4, 6, 8, 12, 16)


class _Builder:
    def __init__(self, rng: random.Random, mesh):
        self.rng, self.mesh = rng, mesh
        self.lines: list[str] = []
        self.values: list[tuple[str, tuple[int, ...]]] = []
        self.count = 0
        self.needs_sum = False

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}.{self.count}"

    def sharding(self, dims, open_bias=0.3, priorities=False) -> str:
        rng, axes = self.rng, [a for a, _ in self.mesh]
        free = axes[:]
        rng.shuffle(free)
        out = []
        for size in dims:
            chosen = []
            while free and rng.random() < 0.4:
                chosen.append(free.pop())
            items = [f'\\"{a}\\"' for a in chosen]
            if rng.random() < open_bias:
                items.append("?")
            text = "{" + ", ".join(items) + "}"
            if priorities and chosen and rng.random() < 0.3:
                text += f"p{rng.randint(0, 2)}"
            out.append(text)
        extra = ""
        if free and rng.random() < 0.15:
            extra = ", replicated={" + f'\\"{free.pop()}\\"' + "}"
        return "<@mesh, [" + ", ".join(out) + "]" + extra + ">"

    def add(self, stem: str, dims, text: str) -> str:
        name = self.name(stem)
        self.lines.append(f"  {name} = f32[{','.join(map(str, dims))}] {text}")
        self.values.append((name, tuple(dims)))
        return name

    def pick(self, rank=None):
        choices = [v for v in self.values if rank is None or len(v[1]) == rank]
        return self.rng.choice(choices) if choices else None


def _shape(rng):
    return tuple(rng.choice(SIZES) for _ in range(rng.randint(1, 3)))


def _step(b: _Builder) -> None:
    rng = b.rng
    kind = rng.choice(["unary", "binary", "binary", "transpose", "reshape", "broadcast",
                       "reduce", "dot", "slice", "concatenate", "pad", "constraint",
                       "constraint", "group"])
    name, dims = b.pick()
    if kind == "unary":
        b.add(rng.choice(["tanh", "neg", "exp"]), dims,
              f"{rng.choice(['tanh', 'negate', 'exponential'])}({name})")
    elif kind == "binary":
        other = b.pick()
        if other[1] != dims:
            other = (b.add("bcast", dims, "broadcast(zero), dimensions={}"), dims)
        b.add("bin", dims, f"{rng.choice(['add', 'multiply', 'maximum'])}({name}, {other[0]})")
    elif kind == "transpose" and len(dims) > 1:
        perm = list(range(len(dims)))
        rng.shuffle(perm)
        b.add("transpose", [dims[p] for p in perm],
              f"transpose({name}), dimensions={{{','.join(map(str, perm))}}}")
    elif kind == "reshape" and len(dims) >= 2:
        merged = (dims[0] * dims[1],) + dims[2:]
        b.add("reshape", merged, f"reshape({name})")
    elif kind == "reshape":
        size = dims[0]
        split = next((d for d in (2, 3, 4) if size % d == 0 and size > d), None)
        if split:
            b.add("reshape", (split, size // split), f"reshape({name})")
    elif kind == "broadcast" and len(dims) < 3:
        new = rng.choice(SIZES)
        at = rng.randint(0, len(dims))
        out = dims[:at] + (new,) + dims[at:]
        kept = [d if d < at else d + 1 for d in range(len(dims))]
        b.add("broadcast", out, f"broadcast({name}), dimensions={{{','.join(map(str, kept))}}}")
    elif kind == "reduce" and len(dims) > 1:
        dim = rng.randrange(len(dims))
        out = dims[:dim] + dims[dim + 1:]
        b.needs_sum = True
        b.add("reduce", out, f"reduce({name}, zero), dimensions={{{dim}}}, to_apply=sum")
    elif kind == "dot" and len(dims) == 2:
        other = next((v for v in b.values if len(v[1]) == 2 and v[1][0] == dims[1]), None)
        if other is None:
            return
        b.add("dot", (dims[0], other[1][1]),
              f"dot({name}, {other[0]}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}")
    elif kind == "slice":
        dim = rng.randrange(len(dims))
        if dims[dim] < 4:
            return
        out = list(dims)
        out[dim] = dims[dim] // 2
        spec = ", ".join(f"[0:{s}]" for s in out)
        b.add("slice", out, f"slice({name}), slice={{{spec}}}")
    elif kind == "concatenate":
        dim = rng.randrange(len(dims))
        out = list(dims)
        out[dim] = 2 * dims[dim]
        b.add("concat", out, f"concatenate({name}, {name}), dimensions={{{dim}}}")
    elif kind == "pad":
        dim = rng.randrange(len(dims))
        out = list(dims)
        out[dim] = dims[dim] + 2
        spec = "x".join("1_1" if d == dim else "0_0" for d in range(len(dims)))
        b.add("pad", out, f"pad({name}, zero), padding={spec}")
    elif kind == "constraint":
        sharding = b.sharding(dims, open_bias=0.3)
        b.add("constraint", dims, f'custom-call({name}), custom_call_target="Sharding", '
              f'frontend_attributes={{xla.sdy.sharding="#sdy.sharding_per_value<[{sharding}]>"}}')
    elif kind == "group":
        other = next((v for v in b.values if v[1] == dims and v[0] != name), None)
        if other is None:
            return
        group = b.count
        for member in (name, other[0]):
            b.lines.append(f"  {b.name('group')} = () custom-call({member}), "
                           f'custom_call_target="xla.sdy.ShardingGroup", '
                           f"custom_call_has_side_effect=true, "
                           f'frontend_attributes={{xla.sdy.sharding_group_id="{group} : i64"}}')


def random_module(seed: int) -> str:
    """A random module in Shardy form (see the module docstring)."""
    rng = random.Random(seed)
    mesh = rng.choice(MESHES)
    b = _Builder(rng, mesh)
    header = "HloModule random_{}, frontend_attributes={{xla.sdy.meshes={{mesh = #sdy.mesh<[{}]>}}}}"
    axes = ", ".join(f'"{a}"={s}' for a, s in mesh)
    b.lines.append("  zero = f32[] constant(0)")
    for k in range(rng.randint(1, 3)):
        dims = _shape(rng)
        attr = ""
        if rng.random() < 0.8:
            sharding = b.sharding(dims, open_bias=0.2, priorities=True)
            attr = f', frontend_attributes={{xla.sdy.sharding="#sdy.sharding{sharding}"}}'
        b.add("p", dims, f"parameter({k}){attr}")
    for _ in range(rng.randint(3, 12)):
        _step(b)
    outputs = rng.sample(b.values[-4:], k=min(len(b.values), rng.randint(1, 2)))
    returned = []
    for name, dims in outputs:
        if rng.random() < 0.5:
            sharding = b.sharding(dims, open_bias=0.0)
            name = b.add("result", dims, f'custom-call({name}), custom_call_target='
                         f'"xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, '
                         f'frontend_attributes={{xla.sdy.sharding='
                         f'"#sdy.sharding_per_value<[{sharding}]>"}}')
        returned.append((name, dims))
    shapes = ", ".join(f"f32[{','.join(map(str, d))}]" for _, d in returned)
    b.lines.append(f"  ROOT out = ({shapes}) tuple({', '.join(n for n, _ in returned)})")
    text = header.format(seed, axes) + "\n\n"
    if b.needs_sum:
        text += reducer("sum", "add") + "\n"
    text += "ENTRY main {\n" + "\n".join(b.lines) + "\n}\n"
    return _with_hlo_shardings(text)


def _with_hlo_shardings(text: str) -> str:
    """Each Shardy sharding's HloSharding beside it, as JAX prints them."""
    module = api.parse(text)
    meshes = module_meshes(module)
    for _, inst in module.all_instructions():
        shardings = instruction_shardings(inst)
        if shardings and inst.opcode in ("parameter", "custom-call") and \
                inst.attrs.get("custom_call_target") != "xla.sdy.FuncResultSharding":
            inst.sharding = to_hlo(shardings[0], resolve_mesh(shardings[0], meshes))
    return api.to_text(module)


def mesh_devices(text: str) -> int:
    meshes = module_meshes(api.parse(text))
    return prod(meshes.meshes[0][1].axis_sizes)
