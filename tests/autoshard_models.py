"""HLO text of the models the autoshard tests plan: a 2-layer MLP and a Transformer layer, with
no shardings unless asked for.

    mlp(batch=1024, d=64, f=64)               # x[batch,d] -> relu(x w1) w2
    transformer_layer(b=8, s=64, d=256, ...)  # attention + MLP with residuals
"""
from __future__ import annotations

from hlo_text import reducer

ADD = reducer("add") + reducer("max")


def mlp(batch: int, d: int, f: int, x_sharding: str = "") -> str:
    """`relu(x w1 + b1) w2` with x[batch,d], w1[d,f], w2[f,d]; `x_sharding` (e.g.
    ", sharding={...}") pins the input."""
    return f"""HloModule mlp

ENTRY e {{
  x = f32[{batch},{d}] parameter(0){x_sharding}
  w1 = f32[{d},{f}] parameter(1)
  b1 = f32[{f}] parameter(2)
  w2 = f32[{f},{d}] parameter(3)
  h = f32[{batch},{f}] dot(x, w1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  bb = f32[{batch},{f}] broadcast(b1), dimensions={{1}}
  hb = f32[{batch},{f}] add(h, bb)
  zero = f32[] constant(0)
  zeros = f32[{batch},{f}] broadcast(zero), dimensions={{}}
  a = f32[{batch},{f}] maximum(hb, zeros)
  ROOT y = f32[{batch},{d}] dot(a, w2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""


def transformer_layer(b: int, s: int, d: int, heads: int, f: int,
                      x_sharding: str = "") -> str:
    """One Transformer layer on x[b,s,d]: attention with `heads` heads of d/heads (projections
    wq, wk, wv, wo), softmax over keys, residual, MLP x w1 -> tanh -> w2, residual."""
    h, dh = heads, d // heads
    return f"""HloModule transformer
{ADD}
ENTRY e {{
  x = f32[{b},{s},{d}] parameter(0){x_sharding}
  wq = f32[{d},{d}] parameter(1)
  wk = f32[{d},{d}] parameter(2)
  wv = f32[{d},{d}] parameter(3)
  wo = f32[{d},{d}] parameter(4)
  w1 = f32[{d},{f}] parameter(5)
  w2 = f32[{f},{d}] parameter(6)
  zero = f32[] constant(0)
  ninf = f32[] constant(-inf)
  q = f32[{b},{s},{d}] dot(x, wq), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  k = f32[{b},{s},{d}] dot(x, wk), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  v = f32[{b},{s},{d}] dot(x, wv), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  q4 = f32[{b},{s},{h},{dh}] reshape(q)
  k4 = f32[{b},{s},{h},{dh}] reshape(k)
  v4 = f32[{b},{s},{h},{dh}] reshape(v)
  scores = f32[{b},{h},{s},{s}] dot(q4, k4), lhs_batch_dims={{0,2}}, rhs_batch_dims={{0,2}}, lhs_contracting_dims={{3}}, rhs_contracting_dims={{3}}
  smax = f32[{b},{h},{s}] reduce(scores, ninf), dimensions={{3}}, to_apply=max
  smaxb = f32[{b},{h},{s},{s}] broadcast(smax), dimensions={{0,1,2}}
  shifted = f32[{b},{h},{s},{s}] subtract(scores, smaxb)
  e = f32[{b},{h},{s},{s}] exponential(shifted)
  esum = f32[{b},{h},{s}] reduce(e, zero), dimensions={{3}}, to_apply=add
  esumb = f32[{b},{h},{s},{s}] broadcast(esum), dimensions={{0,1,2}}
  p = f32[{b},{h},{s},{s}] divide(e, esumb)
  c = f32[{b},{h},{s},{dh}] dot(p, v4), lhs_batch_dims={{0,1}}, rhs_batch_dims={{0,2}}, lhs_contracting_dims={{3}}, rhs_contracting_dims={{1}}
  ct = f32[{b},{s},{h},{dh}] transpose(c), dimensions={{0,2,1,3}}
  c3 = f32[{b},{s},{d}] reshape(ct)
  o = f32[{b},{s},{d}] dot(c3, wo), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  r = f32[{b},{s},{d}] add(x, o)
  f1 = f32[{b},{s},{f}] dot(r, w1), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  g = f32[{b},{s},{f}] tanh(f1)
  f2 = f32[{b},{s},{d}] dot(g, w2), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
  ROOT y = f32[{b},{s},{d}] add(r, f2)
}}
"""


__all__ = ["mlp", "transformer_layer"]


def stack(layers: int, batch: int, d: int) -> str:
    """`layers` identical layers `x <- tanh(x w_i) + x` with x[batch,d], w_i[d,d]."""
    lines = [f"HloModule stack\n\nENTRY e {{\n  x0 = f32[{batch},{d}] parameter(0)"]
    for i in range(layers):
        lines += [f"  w{i} = f32[{d},{d}] parameter({i + 1})",
                  f"  h{i} = f32[{batch},{d}] dot(x{i}, w{i}), lhs_contracting_dims={{1}}, "
                  "rhs_contracting_dims={0}",
                  f"  t{i} = f32[{batch},{d}] tanh(h{i})",
                  f"  x{i + 1} = f32[{batch},{d}] add(t{i}, x{i})"]
    lines += [f"  ROOT y = f32[{batch},{d}] copy(x{layers})", "}"]
    return "\n".join(lines) + "\n"
