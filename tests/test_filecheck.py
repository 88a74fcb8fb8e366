"""The tests' FileCheck matcher (tests/filecheck.py) on small texts: each directive kind
holding and failing, captures, and CHECK-NOT ranges."""
from __future__ import annotations

import pytest

from filecheck import CheckFailure, check, directives

TEXT = """\
%a = f32[4] parameter(0)
%b = f32[4] negate(%a), sharding={replicated}
%c = f32[4] add(%a, %b)
ROOT %d = f32[4] multiply(%c, %c)
"""


def run(source: str) -> dict[str, str]:
    return check(TEXT, directives(source))


def test_directives_are_read_from_comments_in_order():
    found = directives("x\n// CHECK: a\n  // CHECK-NEXT:  b c \n// CHECK-SAME: d\n// CHECK-NOT: e\n")
    assert [(d.kind, d.pattern, d.line) for d in found] == [
        ("CHECK", "a", 2), ("CHECK-NEXT", "b c", 3), ("CHECK-SAME", "d", 4), ("CHECK-NOT", "e", 5)]


def test_holding_directives_and_captures():
    bound = run("""
// CHECK: %[[X:\\w+]] = f32[4] parameter(0)
// CHECK-NEXT: negate(%[[X]])
// CHECK-SAME: sharding={{[{]}}replicated}
// CHECK-NOT: multiply
// CHECK: add(%[[X]], %[[Y:b]])
// CHECK: ROOT {{.*}} multiply""")
    assert bound == {"X": "a", "Y": "b"}


@pytest.mark.parametrize("source, message", [
    ("// CHECK: subtract", "CHECK: subtract does not match"),
    ("// CHECK: parameter\n// CHECK-NEXT: add", "CHECK-NEXT: add does not match"),
    ("// CHECK: negate\n// CHECK-SAME: parameter", "CHECK-SAME: parameter does not match"),
    # the same line, but before the previous match
    ("// CHECK: sharding\n// CHECK-SAME: negate", "CHECK-SAME: negate does not match"),
    ("// CHECK: parameter\n// CHECK-NOT: negate\n// CHECK: add", "matches output line 2"),
    ("// CHECK: add\n// CHECK-NOT: %c", "matches output line 4"),
    ("// CHECK: %[[X:\\w+]] = f32[4] parameter\n// CHECK: negate(%[[X]]x)", "does not match"),
    ("// CHECK: [[UNBOUND]]", "used before it is bound"),
    # a CHECK searches after the previous match's line
    ("// CHECK: add\n// CHECK: negate", "CHECK: negate does not match"),
])
def test_failing_directives(source, message):
    with pytest.raises(CheckFailure, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(source)
