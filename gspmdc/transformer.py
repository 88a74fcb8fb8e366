"""A dense Transformer as HLO text, sharded in two dimensions as in the GSPMD paper: the model of
`gspmdc transformer` and of the paper-scale table (`make paper-scale`).

The program is the forward pass of `layers` identical layers, run as a `while` loop over weights
stacked along a leading layer dimension (the form `jax.lax.scan` over layers takes). Each layer:

    xn = rmsnorm(x) * g1                                     x: [B, S, M]
    q, k, v = xn · Wq, xn · Wk, xn · Wv                      W*: [M, N, D], N·D = M
    p = softmax(q · kᵀ / √D)                                 [B, N, S, S]
    x = x + (p · v) · Wo                                     Wo: [N, D, M]
    xn = rmsnorm(x) * g2
    x = x + relu(xn · Win) · Wout                            Win: [M, H], Wout: [H, M]

On a mesh `X × Y` (devices row-major), the annotations are the paper's 2-D sharding:
activations `[B, S, M]` split B over X and M over Y; the hidden activation `[B, S, H]` B over X
and H over Y; attention's `[B, S, N, D]` B over X and the heads over Y; every weight over both
axes (`Win`: M over X, H over Y; `Wout`: H over Y, M over X; `Wq/Wk/Wv`: M over X, N over Y;
`Wo`: N over Y, M over X; the norms' scales M over Y). So every stored tensor is split `X·Y`
ways; each dot all-gathers its weight along X just in time and its activation along Y, and the
dots that contract a Y-split dimension reduce-scatter their partial sums along Y.
"""
from __future__ import annotations

from dataclasses import dataclass

from gspmdc.errors import GspmdcError
from gspmdc.ir.mesh import Mesh


@dataclass(frozen=True)
class TransformerConfig:
    """The model (`layers`, `width` M, `heads` N, `hidden` H, `batch` B, `sequence` S, element
    type) and the mesh `mesh_x × mesh_y`."""

    layers: int
    width: int
    heads: int
    hidden: int
    batch: int
    sequence: int
    mesh_x: int
    mesh_y: int
    element_type: str = "bf16"

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def devices(self) -> int:
        return self.mesh_x * self.mesh_y

    def check(self) -> None:
        """GspmdcError unless every split is even (the paper's configurations are)."""
        problems = []
        for name, value, by in (("batch", self.batch, self.mesh_x),
                                ("width", self.width, self.mesh_x),
                                ("width", self.width, self.mesh_y),
                                ("hidden", self.hidden, self.mesh_y),
                                ("heads", self.heads, self.mesh_y)):
            if value % by:
                problems.append(f"{name} {value} is not a multiple of {by}")
        if self.width % self.heads:
            problems.append(f"width {self.width} is not a multiple of heads {self.heads}")
        if min(self.layers, self.width, self.heads, self.hidden, self.batch, self.sequence,
               self.mesh_x, self.mesh_y) < 1:
            problems.append("every size must be positive")
        if problems:
            raise GspmdcError("transformer: " + "; ".join(problems))

    @property
    def parameters(self) -> int:
        """Weights of the model (elements)."""
        return self.layers * (4 * self.width * self.width + 2 * self.width * self.hidden
                              + 2 * self.width)


def transformer_hlo(c: TransformerConfig) -> str:
    """The HLO text of the model (see the module docstring)."""
    c.check()
    X, Y = c.mesh_x, c.mesh_y
    L, M, N, D, H, B, S = c.layers, c.width, c.heads, c.head_dim, c.hidden, c.batch, c.sequence
    t = c.element_type

    mesh = Mesh(("x", "y"), (X, Y))

    def sharding(dims: list[tuple[int, str]]) -> str:
        """The mesh sharding splitting each dim over its axis ("" for none)."""
        return mesh.sharding([a or None for _, a in dims]).to_text()

    act = sharding([(B, "x"), (S, ""), (M, "y")])
    hid = sharding([(B, "x"), (S, ""), (H, "y")])
    heads = sharding([(B, "x"), (S, ""), (N, "y"), (D, "")])
    w_qkv = sharding([(L, ""), (M, "x"), (N, "y"), (D, "")])
    w_o = sharding([(L, ""), (N, "y"), (D, ""), (M, "x")])
    w_in = sharding([(L, ""), (M, "x"), (H, "y")])
    w_out = sharding([(L, ""), (H, "y"), (M, "x")])
    scale = sharding([(L, ""), (M, "y")])
    state = (f"(s32[], {t}[{B},{S},{M}], {t}[{L},{M},{N},{D}], {t}[{L},{M},{N},{D}], "
             f"{t}[{L},{M},{N},{D}], {t}[{L},{N},{D},{M}], {t}[{L},{M},{H}], {t}[{L},{H},{M}], "
             f"{t}[{L},{M}], {t}[{L},{M}])")
    names = ["x", "wq", "wk", "wv", "wo", "win", "wout", "g1", "g2"]
    state_shardings = "{{replicated}, " + ", ".join(
        s.strip("{}").join("{}") for s in (act, w_qkv, w_qkv, w_qkv, w_o, w_in, w_out, scale,
                                            scale)) + "}"

    def layer_weight(name: str, dims: list[int]) -> list[str]:
        """Layer i's slice of a stacked weight."""
        one = ",".join(map(str, [1] + dims))
        indices = ", ".join(["i"] + ["zero"] * len(dims))
        return [f"  {name}.s = {t}[{one}] dynamic-slice({name}, {indices}), "
                f"dynamic_slice_sizes={{{one}}}",
                f"  {name}.l = {t}[{','.join(map(str, dims))}] reshape({name}.s)"]

    def rmsnorm(out: str, source: str, g: str) -> list[str]:
        return [
            f"  {out}.sq = {t}[{B},{S},{M}] multiply({source}, {source})",
            f"  {out}.sum = {t}[{B},{S}] reduce({out}.sq, zero.f), dimensions={{2}}, "
            "to_apply=add",
            f"  {out}.mean = {t}[{B},{S}] divide({out}.sum, width.b)",
            f"  {out}.eps = {t}[{B},{S}] add({out}.mean, eps.b)",
            f"  {out}.rs = {t}[{B},{S}] rsqrt({out}.eps)",
            f"  {out}.rsb = {t}[{B},{S},{M}] broadcast({out}.rs), dimensions={{0,1}}",
            f"  {out}.n = {t}[{B},{S},{M}] multiply({source}, {out}.rsb)",
            f"  {out}.gb = {t}[{B},{S},{M}] broadcast({g}.l), dimensions={{2}}",
            f"  {out} = {t}[{B},{S},{M}] multiply({out}.n, {out}.gb), sharding={act}"]

    body = [f"  p = {state} parameter(0), sharding={state_shardings}",
            "  i = s32[] get-tuple-element(p), index=0"]
    for k, name in enumerate(names, start=1):
        body.append(f"  {name} = {_shape_of(name, c)} get-tuple-element(p), index={k}")
    body += ["  zero = s32[] constant(0)", "  one = s32[] constant(1)",
             f"  zero.f = {t}[] constant(0)",
             f"  width.s = {t}[] constant({M})",
             f"  width.b = {t}[{B},{S}] broadcast(width.s), dimensions={{}}",
             f"  eps.s = {t}[] constant(1e-06)",
             f"  eps.b = {t}[{B},{S}] broadcast(eps.s), dimensions={{}}",
             f"  scale.s = {t}[] constant({1 / D ** 0.5!r})",
             f"  scale.b = {t}[{B},{N},{S},{S}] broadcast(scale.s), dimensions={{}}"]
    for name, dims in (("wq", [M, N, D]), ("wk", [M, N, D]), ("wv", [M, N, D]),
                       ("wo", [N, D, M]), ("win", [M, H]), ("wout", [H, M]), ("g1", [M]),
                       ("g2", [M])):
        body += layer_weight(name, dims)
    body += rmsnorm("xn1", "x", "g1")
    for name in ("q", "k", "v"):
        body.append(f"  {name} = {t}[{B},{S},{N},{D}] dot(xn1, w{name}.l), "
                    "lhs_contracting_dims={2}, rhs_contracting_dims={0}, "
                    f"sharding={heads}")
    body += [
        f"  logits.raw = {t}[{B},{N},{S},{S}] dot(q, k), lhs_batch_dims={{0,2}}, "
        "lhs_contracting_dims={3}, rhs_batch_dims={0,2}, rhs_contracting_dims={3}",
        f"  logits = {t}[{B},{N},{S},{S}] multiply(logits.raw, scale.b)",
        f"  neg.inf = {t}[] constant(-inf)",
        f"  lmax = {t}[{B},{N},{S}] reduce(logits, neg.inf), dimensions={{3}}, to_apply=max",
        f"  lmax.b = {t}[{B},{N},{S},{S}] broadcast(lmax), dimensions={{0,1,2}}",
        f"  shifted = {t}[{B},{N},{S},{S}] subtract(logits, lmax.b)",
        f"  e = {t}[{B},{N},{S},{S}] exponential(shifted)",
        f"  esum = {t}[{B},{N},{S}] reduce(e, zero.f), dimensions={{3}}, to_apply=add",
        f"  esum.b = {t}[{B},{N},{S},{S}] broadcast(esum), dimensions={{0,1,2}}",
        f"  probs = {t}[{B},{N},{S},{S}] divide(e, esum.b)",
        f"  ctx = {t}[{B},{N},{S},{D}] dot(probs, v), lhs_batch_dims={{0,1}}, "
        "lhs_contracting_dims={3}, rhs_batch_dims={0,2}, rhs_contracting_dims={1}",
        f"  attn = {t}[{B},{S},{M}] dot(ctx, wo.l), lhs_contracting_dims={{1,3}}, "
        f"rhs_contracting_dims={{0,1}}, sharding={act}",
        f"  x1 = {t}[{B},{S},{M}] add(x, attn), sharding={act}"]
    body += rmsnorm("xn2", "x1", "g2")
    body += [
        f"  h.raw = {t}[{B},{S},{H}] dot(xn2, win.l), lhs_contracting_dims={{2}}, "
        f"rhs_contracting_dims={{0}}, sharding={hid}",
        f"  h.zero = {t}[{B},{S},{H}] broadcast(zero.f), dimensions={{}}",
        f"  h = {t}[{B},{S},{H}] maximum(h.raw, h.zero), sharding={hid}",
        f"  ffn = {t}[{B},{S},{M}] dot(h, wout.l), lhs_contracting_dims={{2}}, "
        f"rhs_contracting_dims={{0}}, sharding={act}",
        f"  x2 = {t}[{B},{S},{M}] add(x1, ffn), sharding={act}",
        "  i1 = s32[] add(i, one)",
        f"  ROOT next = {state} tuple(i1, x2, {', '.join(names[1:])}), "
        f"sharding={state_shardings}"]
    params = [f"  {name} = {_shape_of(name, c)} parameter({k}), sharding={s}"
              for k, (name, s) in enumerate(zip(names, (act, w_qkv, w_qkv, w_qkv, w_o, w_in,
                                                        w_out, scale, scale)))]
    entry = params + [
        "  start = s32[] constant(0)",
        f"  init = {state} tuple(start, {', '.join(names)}), sharding={state_shardings}",
        f"  loop = {state} while(init), condition=more, body=layer, "
        f"sharding={state_shardings}",
        f"  ROOT out = {t}[{B},{S},{M}] get-tuple-element(loop), index=1, sharding={act}"]
    header = (f"// A dense Transformer: {L} layers, width {M}, {N} heads of {D}, hidden {H}, "
              f"batch {B}, sequence {S}, {t};\n// 2-D sharding on a {X}x{Y} mesh "
              f"(gspmdc transformer; see gspmdc/transformer.py)\n"
              f"HloModule transformer, num_partitions={X * Y}, mesh={{x={X}, y={Y}}}\n")
    return "\n".join([
        header,
        f"add {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n"
        f"  ROOT s = {t}[] add(a, b)\n}}\n",
        f"max {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n"
        f"  ROOT m = {t}[] maximum(a, b)\n}}\n",
        f"more {{\n  p = {state} parameter(0)\n  i = s32[] get-tuple-element(p), index=0\n"
        f"  n = s32[] constant({L})\n  ROOT lt = pred[] compare(i, n), direction=LT\n}}\n",
        "layer {\n" + "\n".join(body) + "\n}\n",
        "ENTRY main {\n" + "\n".join(entry) + "\n}\n"])


def sharding_bytes_per_device(c: TransformerConfig) -> dict[str, int]:
    """What the 2-D sharding predicts each device sends over one run, by collective kind, worked
    out from the shapes alone (ring algorithms, `e` bytes per element, G the group size:
    all-gather `(G-1)·shard`, reduce-scatter `(G-1)/G·operand`, all-reduce `2(G-1)/G·operand`).
    Per layer: the norms' sums all-reduced along Y (twice), the normalised activation gathered
    along Y (twice), the six weights gathered along X, the attention output and the
    feed-forward output reduce-scattered along Y."""
    from gspmdc.ir import dtypes
    e = dtypes.byte_width(c.element_type)
    X, Y = c.mesh_x, c.mesh_y
    B, S, M, N, D, H = c.batch // X, c.sequence, c.width, c.heads, c.head_dim, c.hidden
    norm = 2 * (Y - 1) * (B * S * e) // Y if Y > 1 else 0
    activation = (Y - 1) * B * S * (M // Y) * e
    weights = (X - 1) * (4 * (M // X) * (N // Y) * D + 2 * (M // X) * (H // Y)) * e
    partial = (Y - 1) * (B * S * M * e) // Y
    return {"all-reduce": 2 * norm * c.layers, "all-gather": (2 * activation + weights) *
            c.layers, "reduce-scatter": 2 * partial * c.layers}


def _shape_of(name: str, c: TransformerConfig) -> str:
    t, L, M, N, D, H = c.element_type, c.layers, c.width, c.heads, c.head_dim, c.hidden
    return {"x": f"{t}[{c.batch},{c.sequence},{M}]", "wq": f"{t}[{L},{M},{N},{D}]",
            "wk": f"{t}[{L},{M},{N},{D}]", "wv": f"{t}[{L},{M},{N},{D}]",
            "wo": f"{t}[{L},{N},{D},{M}]", "win": f"{t}[{L},{M},{H}]",
            "wout": f"{t}[{L},{H},{M}]", "g1": f"{t}[{L},{M}]", "g2": f"{t}[{L},{M}]"}[name]


__all__ = ["TransformerConfig", "transformer_hlo", "sharding_bytes_per_device"]
