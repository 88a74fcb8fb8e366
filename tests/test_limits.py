"""The documented limits (`ir/limits.py`): programs beyond them are refused where they are read,
exit 2 with `file:line:col`; programs at them run through every command, on both backends,
with no RecursionError or OverflowError anywhere."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gspmdc.cli import main
from gspmdc.errors import RuntimeFailure
from gspmdc.ir import limits

from hlo_text import reducer

GSPMDC = Path(sys.executable).with_name("gspmdc")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
HUGE = 10**23


def nested_tuple(depth: int, leaf: str = "f32[2]") -> str:
    return "(" * depth + leaf + ")" * depth


def nested_calls(depth: int, entry_first: bool) -> str:
    """An entry calling c{depth-2}, which calls ... c0: `depth` computations nest."""
    comps = ["c0 {\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] add(x, x)\n}"]
    comps += [f"c{i} {{\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] call(x), "
              f"to_apply=c{i - 1}\n}}" for i in range(1, depth - 1)]
    entry = (f"ENTRY e {{\n  x = f32[2] parameter(0), sharding={{devices=[2]<=[2]}}\n"
             f"  ROOT r = f32[2] call(x), to_apply=c{depth - 2}\n}}")
    body = [entry] + comps[::-1] if entry_first else comps + [entry]
    return "HloModule m, num_partitions=2\n" + "\n".join(body) + "\n"


def nested_loops(depth: int, state_depth: int) -> str:
    """`depth` computations nest (the entry, then while bodies inside while bodies), each loop
    carrying a value of tuples nested `state_depth - 1` deep in its state (which nests one
    more). Shapes other than the parameters' are left to inference, to keep the text short."""
    state = f"(s32[], {nested_tuple(state_depth - 1)})"
    comps = [f"cond {{\n  s = {state} parameter(0)\n  i = get-tuple-element(s), index=0\n"
             f"  one = s32[] constant(1)\n  ROOT c = compare(i, one), direction=LT\n}}"]
    for i in range(depth - 1):
        inner = "" if i == 0 else (f"  w = while(z), condition=cond, body=b{i - 1}\n"
                                   f"  y = get-tuple-element(w), index=1\n")
        comps.append(
            f"b{i} {{\n  s = {state} parameter(0)\n  i = get-tuple-element(s), index=0\n"
            f"  x = get-tuple-element(s), index=1\n  zero = s32[] constant(0)\n"
            f"  z = tuple(zero, x)\n{inner}  one = s32[] constant(1)\n  j = add(i, one)\n"
            f"  ROOT t = tuple(j, {'y' if i else 'x'})\n}}")
    entry = (f"ENTRY e {{\n  x = {nested_tuple(state_depth - 1)} parameter(0)\n"
             f"  zero = s32[] constant(0)\n  z = tuple(zero, x)\n"
             f"  w = while(z), condition=cond, body=b{depth - 2}\n"
             f"  ROOT r = get-tuple-element(w), index=1\n}}")
    return "HloModule m, num_partitions=2\n" + "\n".join(comps + [entry]) + "\n"


def refused(capsys, tmp_path, text: str, command=("parse",)) -> str:
    path = tmp_path / "p.hlo"
    path.write_text(text)
    code = main([*command, str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "internal error" not in err and "Recursion" not in err and "Overflow" not in err
    return err


# ---- tuples ------------------------------------------------------------------------------------

def test_tuples_nested_beyond_the_limit_are_refused_where_written(tmp_path, capsys):
    depth = limits.MAX_TUPLE_DEPTH + 1
    text = f"HloModule m\nENTRY e {{\n  ROOT p = {nested_tuple(depth)} parameter(0)\n}}\n"
    err = refused(capsys, tmp_path, text)
    assert f"p.hlo:3:12: tuple shapes nest {depth} levels deep here; gspmdc accepts at most " \
           f"{limits.MAX_TUPLE_DEPTH}" in err


@pytest.mark.parametrize("depth", [300, 5000])
def test_deep_tuples_are_refused_by_every_command(tmp_path, capsys, depth):
    text = f"HloModule m\nENTRY e {{\n  ROOT p = {nested_tuple(depth)} parameter(0)\n}}\n"
    for command in (["parse"], ["eval"], ["compile", "-n", "2"], ["propagate"],
                    ["run", "--backend", "local", "-n", "2"]):
        assert "tuple shapes nest" in refused(capsys, tmp_path, text, command)


def test_an_inferred_tuple_beyond_the_limit_is_refused(tmp_path, capsys):
    inner = nested_tuple(limits.MAX_TUPLE_DEPTH)
    text = f"HloModule m\nENTRY e {{\n  p = {inner} parameter(0)\n  ROOT t = tuple(p)\n}}\n"
    err = refused(capsys, tmp_path, text)
    assert "p.hlo:4:12: cannot use the shape inferred for 't': tuple shapes nest 65 levels " \
           "deep" in err


# ---- computations ------------------------------------------------------------------------------

@pytest.mark.parametrize("entry_first", [False, True])
def test_computations_nested_beyond_the_limit_are_refused_at_a_call(tmp_path, capsys,
                                                                    entry_first):
    text = nested_calls(limits.MAX_COMPUTATION_DEPTH + 1, entry_first)
    for command in (["parse"], ["eval"], ["compile", "-n", "2"], ["propagate"],
                    ["run", "--backend", "local"]):
        err = refused(capsys, tmp_path, text, command)
        assert "nests computations more than 64 levels deep" in err and "to_apply=c" in err


@pytest.mark.parametrize("entry_first", [False, True])
def test_three_thousand_nested_calls_are_refused_without_recursion(tmp_path, capsys,
                                                                   entry_first):
    err = refused(capsys, tmp_path, nested_calls(3000, entry_first), ["eval"])
    assert "nests computations more than 64 levels deep" in err


def test_a_shared_callee_counts_from_every_caller(tmp_path, capsys):
    """c40 is reached first alone (40 levels), then from a chain 30 deep: 70 levels."""
    chain = nested_calls(41, entry_first=False).split("ENTRY")[0]
    for i in range(30):
        callee = "c39" if i == 0 else f"d{i - 1}"
        chain += f"d{i} {{\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] call(x), " \
                 f"to_apply={callee}\n}}\n"
    chain += "ENTRY e {\n  x = f32[2] parameter(0)\n  a = f32[2] call(x), to_apply=c39\n" \
             "  ROOT r = f32[2] call(a), to_apply=d29\n}\n"
    assert "nests computations more than 64 levels deep" in refused(capsys, tmp_path, chain)


def test_recursion_is_still_reported_as_such(tmp_path, capsys):
    text = "HloModule m\nf {\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] call(x), " \
           "to_apply=f\n}\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] call(x), " \
           "to_apply=f\n}\n"
    assert "computation 'f' calls itself" in refused(capsys, tmp_path, text)


COMMANDS_AT_THE_LIMIT = [["parse"], ["eval", "-q"], ["compile", "-n", "2"], ["propagate"],
                         ["run", "--backend", "local", "-q"]]


@pytest.mark.parametrize("command", COMMANDS_AT_THE_LIMIT, ids=lambda c: c[0] + c[-1])
def test_programs_at_every_limit_at_once_run_through_every_command(tmp_path, capsys, command):
    """Loops nested as deep as computations may nest, carrying tuples nested as deep as they
    may, and nested calls: everything works (no RecursionError anywhere)."""
    for name, text in (("loops", nested_loops(limits.MAX_COMPUTATION_DEPTH,
                                              limits.MAX_TUPLE_DEPTH)),
                       ("calls", nested_calls(limits.MAX_COMPUTATION_DEPTH, entry_first=True))):
        path = tmp_path / f"{name}.hlo"
        path.write_text(text)
        code = main([*command, str(path)])
        assert code == 0, capsys.readouterr().err


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec not installed in the venv")
def test_programs_at_every_limit_run_on_mpi(tmp_path):
    path = tmp_path / "loops.hlo"
    path.write_text(nested_loops(limits.MAX_COMPUTATION_DEPTH, limits.MAX_TUPLE_DEPTH))
    proc = subprocess.run([str(GSPMDC), "run", str(path), "-q"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


# ---- sizes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["parse"], ["eval"], ["compile", "-n", "2"],
                                     ["run", "--backend", "local", "-n", "2"]])
def test_a_dimension_beyond_int64_is_refused_where_written(tmp_path, capsys, command):
    text = f"HloModule m\nENTRY e {{\n  p = f32[2] parameter(0)\n" \
           f"  ROOT b = f32[{HUGE},2] broadcast(p), dimensions={{1}}\n}}\n"
    err = refused(capsys, tmp_path, text, command)
    assert f"p.hlo:4:16: dimension size {HUGE} is more than the largest size, 2^63-1" in err


def test_an_array_of_more_than_int64_bytes_is_refused(tmp_path, capsys):
    text = f"HloModule m\nENTRY e {{\n  ROOT p = f32[{2**62}] parameter(0)\n}}\n"
    err = refused(capsys, tmp_path, text)
    assert f"p.hlo:3:12: f32[{2**62}]: the array would have {2**62} elements" in err


def test_an_inferred_array_of_more_than_int64_bytes_is_refused(tmp_path, capsys):
    text = f"HloModule m\nENTRY e {{\n  p = f32[{2**60}] parameter(0)\n" \
           f"  ROOT c = concatenate(p, p), dimensions={{0}}\n}}\n"
    assert "p.hlo:4:12: cannot use the shape inferred for 'c': the array would have " \
           f"{2**61} elements" in refused(capsys, tmp_path, text)


@pytest.mark.parametrize("text, message", [
    (f"HloModule m, num_partitions={HUGE}\nENTRY e {{\n  ROOT p = f32[2] parameter(0)\n}}\n",
     "num_partitions must be a positive integer (at most 16777216, 2^24)"),
    # found by make fuzz: the partition count and per-device tables follow these numbers, and
    # 2^32 devices took all memory (exit 3)
    ("HloModule m, num_partitions=4294967296\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n",
     "num_partitions must be a positive integer (at most 16777216, 2^24)"),
    ("HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0), "
     "sharding={devices=[2]0,4294967296}\n}\n",
     "device id 4294967296 is beyond the largest device id gspmdc accepts (16777215)"),
    ("HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0), "
     "sharding={maximal device=16777216}\n}\n",
     "device id 16777216 is beyond the largest device id gspmdc accepts (16777215)"),
    (f"HloModule m{reducer('add')}ENTRY e {{\n  p = f32[4] parameter(0)\n"
     f"  ROOT q = f32[4] all-reduce(p), replica_groups={{{{0,{HUGE}}}}}, to_apply=add\n}}\n",
     "invalid replica groups: ids must be integers in [0, 2^63-1]"),
])
def test_other_numbers_beyond_int64_are_refused(tmp_path, capsys, text, message):
    for command in (["parse"], ["eval"], ["compile", "-n", "2"]):
        assert message in refused(capsys, tmp_path, text, command)


def test_too_many_partitions_for_threads_is_a_runtime_failure(monkeypatch):
    """The local backend runs a thread per partition: when the system refuses one, the run
    stops with a message saying so (exit 3), not an internal error."""
    from gspmdc import api
    from gspmdc.runtime.backends.local import run_local
    module = api.parse("HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n"
                       "  ROOT n = f32[2] negate(p)\n}\n")
    real_start, started = threading.Thread.start, []

    def start(thread):
        if len(started) == 2:
            raise RuntimeError("can't start new thread")
        started.append(thread)
        real_start(thread)
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeFailure, match="cannot start the thread of partition 2 .* one "
                                             "thread per partition, and 4 are too many"):
        run_local(module, [[np.zeros(2, np.float32)]] * 4, 4)


# ---- nesting elsewhere in the text ------------------------------------------------------------

DEEP = 100_000


@pytest.mark.parametrize("where, text", [
    ("array literal", "ROOT c = f32[1] constant(" + "{" * DEEP + "1" + "}" * DEEP + ")"),
    ("tuple literal", "ROOT c = (f32[]) constant(" + "(" * DEEP + "1" + ")" * DEEP + ")"),
    ("sharding", "ROOT p = f32[2] parameter(0), sharding=" + "{" * DEEP + "replicated" +
     "}" * DEEP),
    ("operand shape", "p = (f32[2]) parameter(0)\n  ROOT g = f32[2] get-tuple-element(" +
     "(" * DEEP + "f32[2]" + ")" * DEEP + " p), index=0"),
])
def test_deep_nesting_in_other_places_is_refused_cleanly(tmp_path, capsys, where, text):
    for command in (["parse"], ["compile", "-n", "2"]):
        refused(capsys, tmp_path, f"HloModule m\nENTRY e {{\n  {text}\n}}\n", command)


@pytest.mark.parametrize("depth", [limits.MAX_TUPLE_DEPTH, limits.MAX_TUPLE_DEPTH + 1, DEEP])
def test_a_deeply_nested_attribute_value_is_kept_verbatim(tmp_path, capsys, depth):
    """Unknown attributes are printed back as written; nesting beyond the limit keeps the value
    as text instead of a nested Python value."""
    value = "{" * depth + "x" + "}" * depth
    path = tmp_path / "p.hlo"
    path.write_text(f"HloModule m\nENTRY e {{\n  ROOT p = f32[2] parameter(0), foo={value}\n}}\n")
    for command in (["parse"], ["compile", "-n", "2"], ["propagate"]):
        assert main([*command, str(path)]) == 0
        assert f"foo={value}" in capsys.readouterr().out
