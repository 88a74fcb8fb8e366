"""The ranks' position board: an interpreter run records the instruction being executed (the
innermost one, nested computations included) in the rank's slot of a shared file, which another
reader sees and which stays readable after the writer is gone."""
from __future__ import annotations

import numpy as np

from gspmdc.ir.parser import parse_module
from gspmdc.runtime.interpreter import evaluate
from gspmdc.runtime.kernels import KERNELS
from gspmdc.runtime.rank_position import (
    FINISHING, STARTING, PositionBoard, create_board_file, describe, describe_ranks,
    read_board_file,
)

LOOP = """HloModule loop

cond {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(i, three), direction=LT
}

body {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[2] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[2] sine(x)
  ROOT t = (s32[], f32[2]) tuple(j, y)
}

ENTRY main {
  x = f32[2] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[2]) tuple(zero, x)
  w = (s32[], f32[2]) while(init), condition=cond, body=body
  ROOT r = f32[2] get-tuple-element(w), index=1
}
"""


def test_the_board_records_the_innermost_instruction_for_another_reader(tmp_path, monkeypatch):
    module = parse_module(LOOP)
    path = tmp_path / "positions"
    create_board_file(path, 3)
    assert read_board_file(path) == [STARTING] * 3
    board = PositionBoard(path, 1, 3)
    seen = []
    sine = KERNELS["sine"]

    def spy(inst, args, ctx):             # what a reader of the file sees while sine runs
        seen.append(describe(module, read_board_file(path)[1]))
        return sine(inst, args, ctx)
    monkeypatch.setitem(KERNELS.rules, "sine", spy)
    result = evaluate(module, [np.zeros(2, np.float32)], position=board.position(module))
    np.testing.assert_array_equal(result, np.sin(np.sin(np.sin(np.zeros(2, np.float32)))))
    assert seen == ["executing body/y (sine)"] * 3
    assert describe(module, read_board_file(path)[1]) == "executing main/r (get-tuple-element)"
    board.set(FINISHING)
    del board
    assert read_board_file(path) == [STARTING, FINISHING, STARTING]


def test_descriptions():
    module = parse_module(LOOP)
    numbers = {f"{c.name}/{i.name}": k for k, (c, i) in enumerate(module.all_instructions())}
    assert describe(module, STARTING) == "setting up (before the first instruction)"
    assert describe(module, FINISHING) == "assembling the outputs (after the last instruction)"
    assert describe(None, 7) == "executing instruction #7"
    codes = {0: numbers["main/w"], 1: numbers["body/y"], 2: numbers["main/w"], 3: STARTING}
    assert describe_ranks(module, codes) == (
        "rank 1 executing body/y (sine); rank 3 setting up (before the first instruction); "
        "ranks 0, 2 executing main/w (while)")


def test_a_private_board_knows_only_its_own_slot():
    module = parse_module(LOOP)
    board = PositionBoard(None, 0, 4)
    assert not board.shared and board.get(0) == STARTING
    evaluate(module, [np.ones(2, np.float32)], position=board.position(module))
    assert describe(module, board.get(0)) == "executing main/r (get-tuple-element)"
    # instructions are known by identity: those of another parse are not numbered
    assert id(parse_module(LOOP).entry.root) not in board.position(module).numbers
