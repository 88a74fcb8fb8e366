"""A text mutator for the parser: broken variants of valid modules.

`mutant(corpus, seed, index)` is one mutated text, each from one corpus text with one to three
mutations: token deletions, duplications and swaps, number changes, huge numbers, truncation,
bracket damage, attribute garbling, shape and sharding damage, line deletions, duplications,
swaps and splices from other modules, character flips, and deep nesting (brackets, tuple
shapes, nested calls). Deterministic for a seed."""
from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Callable, Sequence

#: tokens: names (with %, dots, dashes), numbers, quoted strings, brackets and punctuation,
#: white space (kept, so joining the tokens gives the text back)
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|%?[A-Za-z_][\w.\-]*|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|'
                   r'\s+|.', re.S)
HUGE = ["99999999999999999999999", "18446744073709551616", "9223372036854775808",
        "-9223372036854775809", "4294967296", "2147483648", "-2147483649", "1e999", "-1e999",
        "1" + "0" * 400, "nan", "inf", "-0", "0", "-1", "65536"]
OPCODES = ["add", "dot", "reduce", "while", "tuple", "get-tuple-element", "parameter",
           "constant", "broadcast", "reshape", "transpose", "slice", "gather", "scatter", "sort",
           "convolution", "custom-call", "conditional", "call", "iota", "pad", "concatenate",
           "all-reduce", "partition-id", "rng", "fusion", "bitcast", "copy", "fft"]
ATTRIBUTES = ["dimensions", "sharding", "slice", "padding", "window", "dim_labels", "to_apply",
              "index", "iota_dimension", "lhs_contracting_dims", "condition", "body",
              "direction", "custom_call_target", "metadata", "backend_config",
              "frontend_attributes", "replica_groups", "channel_id", "kind", "calls"]
BRACKETS = "()[]{}<>"


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def _solid(toks: list[str]) -> list[int]:
    return [i for i, t in enumerate(toks) if not t.isspace()]


def _pick(rng: random.Random, items: Sequence[int]) -> int | None:
    return rng.choice(items) if items else None


def delete_token(text: str, rng: random.Random, corpus) -> str:
    toks = tokens(text)
    i = _pick(rng, _solid(toks))
    if i is not None:
        del toks[i]
    return "".join(toks)


def duplicate_token(text: str, rng: random.Random, corpus) -> str:
    toks = tokens(text)
    i = _pick(rng, _solid(toks))
    if i is not None:
        toks.insert(i, toks[i] + (" " if rng.random() < 0.5 else ""))
    return "".join(toks)


def swap_tokens(text: str, rng: random.Random, corpus) -> str:
    toks = tokens(text)
    solid = _solid(toks)
    if len(solid) < 2:
        return text
    k = rng.randrange(len(solid) - 1)
    i, j = (solid[k], solid[k + 1]) if rng.random() < 0.6 else rng.sample(solid, 2)
    toks[i], toks[j] = toks[j], toks[i]
    return "".join(toks)


def change_number(text: str, rng: random.Random, corpus) -> str:
    toks = tokens(text)
    numbers = [i for i, t in enumerate(toks) if re.fullmatch(r"-?\d+(\.\d+)?([eE][+-]?\d+)?", t)]
    i = _pick(rng, numbers)
    if i is None:
        return text
    old = toks[i]
    value = float(old)                    # a number an earlier mutation made huge is inf
    near = int(value) if math.isfinite(value) else 0
    choices = [str(near + rng.choice([-2, -1, 1, 2])), "0", "-1", "1", "3",
               str(rng.randrange(100)), old + "0", "0.5"]
    toks[i] = rng.choice(choices)
    return "".join(toks)


def huge_number(text: str, rng: random.Random, corpus) -> str:
    toks = tokens(text)
    numbers = [i for i, t in enumerate(toks) if re.fullmatch(r"-?\d+(\.\d+)?", t)]
    i = _pick(rng, numbers)
    if i is None:
        return text
    toks[i] = rng.choice(HUGE)
    return "".join(toks)


def truncate(text: str, rng: random.Random, corpus) -> str:
    return text[:rng.randrange(len(text) + 1)]


def bracket_damage(text: str, rng: random.Random, corpus) -> str:
    positions = [i for i, ch in enumerate(text) if ch in BRACKETS]
    kind = rng.choice(["delete", "insert", "replace"])
    if kind == "insert" or not positions:
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.choice(BRACKETS) + text[i:]
    i = rng.choice(positions)
    if kind == "delete":
        return text[:i] + text[i + 1:]
    return text[:i] + rng.choice(BRACKETS) + text[i + 1:]


def garble_attribute(text: str, rng: random.Random, corpus) -> str:
    matches = list(re.finditer(r"([A-Za-z_][\w.]*)=", text))
    if not matches:
        return text
    m = rng.choice(matches)
    kind = rng.choice(["rename", "drop_equals", "value", "duplicate", "other_name", "remove"])
    start, end = m.span(1)
    name = m.group(1)
    if kind == "rename" and len(name) > 1:
        k = rng.randrange(len(name))
        return text[:start + k] + text[start + k + 1:]
    if kind == "drop_equals":
        return text[:end] + text[end + 1:]
    if kind == "other_name":
        return text[:start] + rng.choice(ATTRIBUTES) + text[end:]
    value_end = _value_end(text, end + 1)
    if kind == "value":
        replacement = rng.choice(["{}", "{0}", "{1,0}", "x", '"x"', "{{0,1},{2}}", "", "-1",
                                  "{replicated}", "{devices=[2]0}", "[0:1]", "1_1"])
        return text[:end + 1] + replacement + text[value_end:]
    if kind == "duplicate":
        return text[:value_end] + ", " + text[start:value_end] + text[value_end:]
    return text[:max(start - 2, 0)] + text[value_end:]


def _value_end(text: str, i: int) -> int:
    """The end of an attribute value starting at `i`: balanced brackets up to a top-level
    comma, newline or closing bracket."""
    depth = 0
    while i < len(text):
        ch = text[i]
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            if depth == 0:
                return i
            depth -= 1
        elif ch in ",\n" and depth == 0:
            return i
        elif ch == '"':
            close = text.find('"', i + 1)
            i = close if close >= 0 else len(text)
        i += 1
    return i


def damage_shape(text: str, rng: random.Random, corpus) -> str:
    matches = list(re.finditer(r"\b(pred|[subf]\d+|bf16|c64|c128|token)\[([^\]]*)\]", text))
    if not matches:
        return text
    m = rng.choice(matches)
    kind = rng.choice(["dims", "type", "rank", "layout"])
    if kind == "dims":
        dims = [d for d in m.group(2).split(",") if d]
        if dims:
            k = rng.randrange(len(dims))
            dims[k] = rng.choice(["0", "1", "7", "-1", "100", "?", "<=4", dims[k] + "1"])
        new = f"{m.group(1)}[{','.join(dims)}]"
    elif kind == "type":
        new = f"{rng.choice(['f32', 's32', 'pred', 'bf16', 'u64', 'f8e4m3fn', 'x32', 'token'])}" \
              f"[{m.group(2)}]"
    elif kind == "rank":
        new = f"{m.group(1)}[{m.group(2)}{',' if m.group(2) else ''}{rng.randrange(1, 5)}]"
    else:
        new = m.group(0) + rng.choice(["{0}", "{1,0}", "{0,1,2}", "{}", "{0:T(8,128)}"])
    return text[:m.start()] + new + text[m.end():]


def damage_sharding(text: str, rng: random.Random, corpus) -> str:
    matches = list(re.finditer(r"sharding=\{", text))
    if not matches:
        return text
    m = rng.choice(matches)
    end = _value_end(text, m.end() - 1)
    inner = text[m.end():end - 1] if end > m.end() else ""
    options = ["replicated", "manual", "maximal device=99", "maximal device=-1",
               "devices=[2,2]0,1,2", "devices=[2]<=[3]", "devices=[2,1]<=[2,1]T(1,0)",
               "devices=[0]", "devices=[1,1]0 last_tile_dim_replicate",
               "devices=[2,2]<=[4] last_tile_dims={replicated, manual}",
               "devices=[4]<=[4] last_tile_dims={replicated}", "{replicated}, {replicated}",
               "devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate", inner + " shard_as 1",
               inner.replace("<=", "="), inner + " metadata={op_name=\"x\"}", "unknown",
               "devices=[3,3]<=[9]", "devices=[2]1,1"]
    return text[:m.end()] + rng.choice(options) + text[end - 1 if end > m.end() else end:]


def _lines(text: str) -> list[str]:
    return text.split("\n")


def delete_line(text: str, rng: random.Random, corpus) -> str:
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return "\n".join(lines)


def duplicate_line(text: str, rng: random.Random, corpus) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[i])
    return "\n".join(lines)


def swap_lines(text: str, rng: random.Random, corpus) -> str:
    lines = _lines(text)
    if len(lines) < 2:
        return text
    i, j = rng.sample(range(len(lines)), 2)
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def splice_line(text: str, rng: random.Random, corpus) -> str:
    other = _lines(rng.choice(corpus))
    lines = _lines(text)
    lines.insert(rng.randrange(len(lines) + 1), rng.choice(other))
    return "\n".join(lines)


def replace_opcode(text: str, rng: random.Random, corpus) -> str:
    matches = list(re.finditer(r" ([a-z][a-z0-9\-]*)\(", text))
    if not matches:
        return text
    m = rng.choice(matches)
    return text[:m.start(1)] + rng.choice(OPCODES) + text[m.end(1):]


def flip_character(text: str, rng: random.Random, corpus) -> str:
    if not text:
        return rng.choice("{}()x=,")
    i = rng.randrange(len(text))
    return text[:i] + rng.choice('{}[]()<>=,:;%"\'\\/*#@!x0\t\n\x00\u00e9\u2028\ufeff') + \
        text[i + 1:]


def deep_nesting(text: str, rng: random.Random, corpus) -> str:
    depth = rng.choice([64, 300, 1000, 5000, 50000])
    kind = rng.choice(["brackets", "tuple_shape", "literal", "calls", "attribute"])
    if kind == "brackets":
        i = rng.randrange(len(text) + 1)
        opening = rng.choice("([{")
        close = {"(": ")", "[": "]", "{": "}"}[opening]
        return text[:i] + opening * depth + (close * depth if rng.random() < 0.5 else "") + text[i:]
    if kind == "tuple_shape":
        shape = "(" * depth + "f32[2]" + ")" * depth
        return (f"HloModule deep\n\nENTRY e {{\n  p = {shape} parameter(0)\n"
                f"  ROOT t = {shape} copy(p)\n}}\n")
    if kind == "literal":
        return (f"HloModule deep\n\nENTRY e {{\n  ROOT c = f32[{','.join(['1'] * min(depth, 64))}] "
                f"constant({'{' * depth}1{'}' * depth})\n}}\n")
    if kind == "attribute":
        return text.replace("dimensions={", "dimensions=" + "{" * depth, 1) + "}" * depth
    n = min(depth, 3000)
    comps = ["c0 {\n  ROOT p = f32[] parameter(0)\n}\n"]
    for k in range(1, n):
        comps.append(f"c{k} {{\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), "
                     f"to_apply=c{k - 1}\n}}\n")
    return ("HloModule deep\n\n" + "".join(comps) +
            f"ENTRY e {{\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=c{n - 1}\n}}\n")


MUTATIONS: list[tuple[Callable[[str, random.Random, list[str]], str], float]] = [
    (delete_token, 4), (duplicate_token, 3), (swap_tokens, 3), (change_number, 4),
    (huge_number, 2), (truncate, 2), (bracket_damage, 3), (garble_attribute, 4),
    (damage_shape, 3), (damage_sharding, 3), (delete_line, 2), (duplicate_line, 2),
    (swap_lines, 2), (splice_line, 2), (replace_opcode, 2), (flip_character, 3),
    (deep_nesting, 0.3),
]


def mutate(text: str, rng: random.Random, corpus: list[str]) -> tuple[str, list[str]]:
    """`text` with one to three random mutations, and their names."""
    names = []
    functions = [f for f, _ in MUTATIONS]
    weights = [w for _, w in MUTATIONS]
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        fn = rng.choices(functions, weights)[0]
        text = fn(text, rng, corpus)
        names.append(fn.__name__)
    return text, names


def mutant(corpus: list[str], seed: int, index: int) -> tuple[str | bytes, list[str]]:
    """Mutant `index` of the campaign `seed` (the same whatever else runs): a mutated corpus
    text and its mutations' names; now and then as bytes with one that is not UTF-8."""
    rng = random.Random(f"{seed}:{index}")
    text, names = mutate(rng.choice(corpus), rng, corpus)
    if rng.random() < 0.01:
        data = text.encode()
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]) + data[i:], \
            names + ["invalid_utf8"]
    return text, names


def corpus_texts(*, generated: int = 200, shared: Path | None = None) -> list[str]:
    """The mutator's corpus: the bundled examples, `generated` generated modules, and the HLO
    texts of the team's conformance data when `shared` (a `../shared` directory) has them."""
    import json
    from . import case
    root = Path(__file__).resolve().parents[2]
    texts = [p.read_text() for p in sorted((root / "gspmdc" / "examples").glob("*.hlo"))]
    texts += [case(seed).text for seed in range(generated)]
    if shared is not None:
        for path in sorted((shared / "conformance").glob("*.json")):
            texts += [c["hlo"] for c in json.loads(path.read_text()).get("cases", [])
                      if isinstance(c.get("hlo"), str)]
    return texts
