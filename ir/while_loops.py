"""While loops whose condition cannot change: once entered, such a loop never terminates.

`while(init), condition=c, body=b` runs `state = b(state)` for as long as `c(state)` holds. When
`c` is a pure function of the state (nothing in it or in what it calls draws random numbers,
talks to other partitions or the host, or has a side effect) that reads the state only through
`get-tuple-element`, and `b`'s root is a tuple that passes each element `c` reads through
unchanged (its operand i is `get-tuple-element(b's parameter), index=i`), then `c` sees the
same values in every iteration: if it holds once it holds forever, whatever else the body
computes (collectives included). XLA's propagation test `WhileConv` is such a loop: its counter
is never incremented.

The runtime refuses to run one (instead of hanging) and `gspmdc cost` names it.
"""
from __future__ import annotations

from .module import Computation, Instruction, Module
from .ops import COLLECTIVES, HOST_IO, RNG_STATE, has_side_effect

#: opcodes whose result is not a function of their operands on this partition (random numbers,
#: values from other partitions or the host)
_NOT_FUNCTIONS = RNG_STATE | COLLECTIVES | HOST_IO


def invariant_condition_elements(loop: Instruction, module: Module) -> tuple[int, ...] | None:
    """The loop-state tuple indices `loop`'s condition reads (ascending; empty when it reads
    none), when the condition cannot change from one iteration to the next (see the module
    docstring); None when it may."""
    condition = module.computation(loop.attr("condition").name)
    body = module.computation(loop.attr("body").name)
    if not is_pure(condition, module):
        return None
    (state,) = condition.parameters
    readers = [inst for inst in condition.instructions if state in inst.operands]
    if condition.root is state or any(r.opcode != "get-tuple-element" for r in readers):
        return None
    read = sorted({r.attr("index") for r in readers})
    if not all(_passes_through(body, index) for index in read):
        return None
    return tuple(read)


def is_pure(computation: Computation, module: Module) -> bool:
    """Whether `computation`, with everything it calls, is a function of its arguments on this
    partition: no instruction of `_NOT_FUNCTIONS`, none with a side effect (`has_side_effect`)."""
    return all(
        inst.opcode not in _NOT_FUNCTIONS and not has_side_effect(inst)
        and all(is_pure(module.computation(name), module)
                for name in inst.called_computation_names())
        for inst in computation.instructions)


def _passes_through(body: Computation, index: int) -> bool:
    """Whether `body`'s root tuple has `get-tuple-element(parameter), index=index` at `index`."""
    root = body.root
    if root.opcode != "tuple" or index >= len(root.operands):
        return False
    element = root.operands[index]
    return (element.opcode == "get-tuple-element" and element.attr("index") == index
            and element.operands[0] is body.parameters[0])
