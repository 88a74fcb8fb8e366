"""Failures the fuzz checks know to come from open, reported product defects (each with the
place it is tracked), so the CI sample marks them as expected failures instead of hiding them:
a case that fails any other way fails its test. An entry names a real open defect; remove it
when the defect is fixed. Empty while no fuzz failure is known to come from one."""
from __future__ import annotations

import re

#: (pattern of the failure detail, the defect)
KNOWN_DEFECTS: list[tuple[re.Pattern, str]] = []


def known_defect(detail: str) -> str | None:
    """The known defect a failure's detail shows, or None."""
    for pattern, defect in KNOWN_DEFECTS:
        if pattern.search(detail):
            return defect
    return None
