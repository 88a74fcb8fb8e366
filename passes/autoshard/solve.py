"""Solving the problem: an integer program (HiGHS through highspy), a heuristic when it runs out
of time.

The integer program (the intra-operator formulation of Alpa, with XLA's memory rows):

    minimise    Σ_c Σ_a unary[c][a] x[c][a]  +  Σ_pairs Σ_g,h cost[g][h] e[g][h]
                                             +  Σ_shared Σ_g,t cost[g][t] z[g][t]
    subject to  Σ_a x[c][a] = 1                                 every choice c
                Σ_h e[g][h] = Σ_{a in group g of u} x[u][a]      every pair (u, v), group g
                Σ_g e[g][h] = Σ_{b in group h of v} x[v][b]      every pair, group h
                z[g][t] ≥ e[g][h]          every shared value, user, need h meaning t
                Σ_(c,a) bytes[c][a] x[c][a] ≤ limit             every memory row
                x binary, e, z ≥ 0

Given binary x, the two families of pair rows force `e[g][h] = 1` for the chosen groups and 0
elsewhere (the flow of one unit from the source's group to the target's), so e needs no
integrality, and a pair costs one variable per pair of *groups* (distinct shardings), not per
pair of strategies. A value with several users in other choices (`problem.Shared`) is
resharded once per sharding its users need: `z[g][t]` is 1 when the value has sharding g and
some user needs t (at least each user's flow into t; where a side has one sharding only, at
least the sum of the other side's strategies meaning g or t), and carries the reshard's cost
once.

The heuristic (`heuristic`): every choice takes its cheapest strategy, then, choice by choice
in order, the strategy that is cheapest given all the others (iterated until nothing
improves, at most `ROUNDS` rounds); under a memory limit, strategies are scored with the bytes
over the limit as a penalty. Its plan is handed to the solver as a start, so the solver's best
plan is never worse; when the time limit is reached, the best plan found is used and the
message says how far from proven optimal it may be, or that the heuristic's plan is used.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .problem import Problem

#: rounds of the heuristic's improvement sweeps
ROUNDS = 20


@dataclass(frozen=True)
class MemoryRow:
    """`Σ bytes[c][a] x[c][a] + Σ bytes[p][g][h] e[p][g][h] ≤ limit` over the choices listed
    (`terms`: choice -> bytes per strategy) and pairs (`pair_terms`: pair index -> bytes per
    pair of groups: the resharded copy an instruction reads); `where` names the program
    point."""

    terms: dict[int, np.ndarray]
    pair_terms: dict[int, np.ndarray]
    limit: float
    where: str

    def bytes(self, problem: Problem, assignment: list[int]) -> float:
        """The row's bytes under an assignment."""
        total = sum(float(v[assignment[c]]) for c, v in self.terms.items())
        for p, matrix in self.pair_terms.items():
            pair = problem.pairs[p]
            total += float(matrix[pair.groups_u[assignment[pair.u]],
                                  pair.groups_v[assignment[pair.v]]])
        return total


@dataclass(frozen=True)
class Solution:
    """One strategy per choice, its modelled seconds, and how it was found: `status` is
    "optimal", "time limit" (the solver's best plan when its time ran out; `gap` the relative
    distance to its bound), "heuristic" (the solver found nothing better in its time) or
    "infeasible" (no plan satisfies the memory rows)."""

    assignment: list[int]
    seconds: float
    status: str
    gap: float
    solve_seconds: float
    message: str


def solve(problem: Problem, memory: list[MemoryRow], time_limit: float,
          excluded: tuple[tuple[int, ...], ...] = ()) -> Solution:
    """The cheapest assignment satisfying `memory` and differing from every assignment of
    `excluded` (plans already found not to fit), within `time_limit` seconds of solving."""
    import time
    start = time.perf_counter()
    start_plan = heuristic(problem, memory)
    if all(problem.size(c) == 1 for c in range(problem.num_choices)):
        elapsed = time.perf_counter() - start
        if not _fits(problem, memory, start_plan) or tuple(start_plan) in excluded:
            return Solution(start_plan, problem.objective(start_plan), "infeasible", 0.0,
                            elapsed, "no plan fits the memory limit")
        return Solution(start_plan, problem.objective(start_plan), "optimal", 0.0, elapsed,
                        "optimal (one plan only)")
    highs, columns = _model(problem, memory, excluded)
    highs.setOptionValue("time_limit", float(time_limit))
    highs.setOptionValue("mip_rel_gap", 1e-6)
    highs.setOptionValue("threads", 1)
    values = np.zeros(highs.getNumCol())
    for c, a in enumerate(start_plan):
        if columns[c] is not None:
            values[columns[c] + a] = 1.0
    if _fits(problem, memory, start_plan) and tuple(start_plan) not in excluded:
        highs.setSolution(_solution(values, highs))
    highs.run()
    status = highs.getModelStatus()
    info = highs.getInfo()
    elapsed = time.perf_counter() - start
    import highspy
    statuses = highspy.HighsModelStatus
    if status == statuses.kInfeasible:
        return Solution(start_plan, problem.objective(start_plan), "infeasible", 0.0, elapsed,
                        "no plan fits the memory limit")
    found = info.primal_solution_status == highspy.kSolutionStatusFeasible
    if found:
        x = np.asarray(highs.getSolution().col_value)
        assignment = [0 if columns[c] is None else
                      int(np.argmax(x[columns[c]:columns[c] + problem.size(c)]))
                      for c in range(problem.num_choices)]
    else:
        assignment = start_plan
    seconds = problem.objective(assignment)
    if status == statuses.kOptimal:
        return Solution(assignment, seconds, "optimal", 0.0, elapsed, "optimal")
    if status == statuses.kTimeLimit:
        if found:
            gap = float(info.mip_gap)
            return Solution(assignment, seconds, "time limit", gap, elapsed,
                            f"the solver reached its time limit of {time_limit:g} s: using the "
                            f"best plan it found (within {100 * gap:.2g}% of optimal)")
        if not _fits(problem, memory, start_plan) or tuple(start_plan) in excluded:
            return Solution(start_plan, problem.objective(start_plan), "infeasible", 0.0,
                            elapsed, f"the solver reached its time limit of {time_limit:g} s "
                            "without finding a plan that fits the memory limit")
        return Solution(start_plan, problem.objective(start_plan), "heuristic", 1.0, elapsed,
                        f"the solver reached its time limit of {time_limit:g} s: using the "
                        "heuristic plan (each value's cheapest sharding given the others)")
    raise RuntimeError(f"the solver stopped with status {highs.modelStatusToString(status)}")


def _model(problem: Problem, memory: list[MemoryRow], excluded=()):
    """The HiGHS model and the first column of each choice (None for single-strategy ones)."""
    import highspy
    with _quiet():
        highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    costs: list[float] = []
    integer: list[bool] = []
    columns: list[int | None] = []
    for c in range(problem.num_choices):
        if problem.size(c) == 1:
            columns.append(None)
            continue
        columns.append(len(costs))
        costs.extend(problem.unary[c].tolist())
        integer.extend([True] * problem.size(c))
    rows_lo: list[float] = []
    rows_hi: list[float] = []
    entries: list[tuple[int, int, float]] = []

    def row(terms, lo, hi):
        r = len(rows_lo)
        rows_lo.append(lo)
        rows_hi.append(hi)
        entries.extend((r, col, value) for col, value in terms)

    for c, first in enumerate(columns):
        if first is not None:
            row([(first + a, 1.0) for a in range(problem.size(c))], 1.0, 1.0)
    pair_columns = []
    for p in problem.pairs:
        groups_u, groups_v = p.cost.shape
        first_e = len(costs)
        pair_columns.append(first_e)
        costs.extend(p.cost.ravel().tolist())
        integer.extend([False] * p.cost.size)
        for g in range(groups_u):
            terms = [(first_e + g * groups_v + h, 1.0) for h in range(groups_v)]
            terms += [(columns[p.u] + a, -1.0) for a in np.flatnonzero(p.groups_u == g)]
            row(terms, 0.0, 0.0)
        for h in range(groups_v):
            terms = [(first_e + g * groups_v + h, 1.0) for g in range(groups_u)]
            terms += [(columns[p.v] + b, -1.0) for b in np.flatnonzero(p.groups_v == h)]
            row(terms, 0.0, 0.0)
    def choice_sum(c, chosen: np.ndarray):
        """Terms of Σ x[c][a] over the strategies `chosen` (a mask), and its constant part."""
        if columns[c] is None:
            return [], float(chosen[0])
        return [(columns[c] + int(a), 1.0) for a in np.flatnonzero(chosen)], 0.0

    for sh in problem.shared:
        groups, targets = sh.cost.shape
        first_z = len(costs)
        costs.extend(sh.cost.ravel().tolist())
        integer.extend([False] * sh.cost.size)

        def z(g, t):
            return first_z + g * targets + t
        for v, needs, p, to_target in sh.users:
            if p is not None:                   # z[g, t] >= e[g, h] for the need h meaning t
                first_e = pair_columns[p]
                width = problem.pairs[p].cost.shape[1]
                for g in range(groups):
                    for h in range(width):
                        row([(z(g, int(to_target[h])), 1.0), (first_e + g * width + h, -1.0)],
                            0.0, highspy.kHighsInf)
            elif groups == 1:                   # z[0, t] >= Σ x[v][b] over b needing t
                for t in np.unique(needs):
                    terms, constant = choice_sum(v, needs == t)
                    row([(z(0, int(t)), 1.0)] + [(col, -w) for col, w in terms], constant,
                        highspy.kHighsInf)
            else:                               # one need t: z[g, t] >= Σ x[u][a] in group g
                t = int(needs[0])
                for g in range(groups):
                    terms, constant = choice_sum(sh.u, sh.groups_u == g)
                    row([(z(g, t), 1.0)] + [(col, -w) for col, w in terms], constant,
                        highspy.kHighsInf)
    for plan in excluded:                       # Σ x[c][plan[c]] <= choices - 1
        terms = [(columns[c] + a, 1.0) for c, a in enumerate(plan) if columns[c] is not None]
        row(terms, -highspy.kHighsInf, len(terms) - 1.0)
    for m in memory:
        fixed = sum(float(v[0]) for c, v in m.terms.items() if columns[c] is None)
        terms = [(columns[c] + a, float(v[a])) for c, v in m.terms.items()
                 if columns[c] is not None for a in range(len(v)) if v[a]]
        for p, matrix in m.pair_terms.items():
            flat = matrix.ravel()
            terms += [(pair_columns[p] + k, float(flat[k])) for k in np.flatnonzero(flat)]
        row(terms, -highspy.kHighsInf, m.limit - fixed)
    lp = highspy.HighsLp()
    lp.num_col_ = len(costs)
    lp.num_row_ = len(rows_lo)
    lp.col_cost_ = np.asarray(costs, dtype=np.float64)
    lp.col_lower_ = np.zeros(len(costs))
    lp.col_upper_ = np.ones(len(costs))
    lp.row_lower_ = np.asarray(rows_lo, dtype=np.float64)
    lp.row_upper_ = np.asarray(rows_hi, dtype=np.float64)
    if entries:
        array = np.asarray(entries, dtype=np.float64)
        order = np.lexsort((array[:, 0], array[:, 1]))
        array = array[order]
        cols = array[:, 1].astype(np.int64)
        starts = np.searchsorted(cols, np.arange(len(costs) + 1))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = starts.astype(np.int32)
        lp.a_matrix_.index_ = array[:, 0].astype(np.int32)
        lp.a_matrix_.value_ = array[:, 2]
    else:
        lp.a_matrix_.start_ = np.zeros(len(costs) + 1, dtype=np.int32)
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in integer]
    highs.passModel(lp)
    return highs, columns


def _solution(values: np.ndarray, highs):
    import highspy
    solution = highspy.HighsSolution()
    solution.col_value = values.tolist()
    return solution


@contextmanager
def _quiet():
    """Standard output closed while HiGHS constructs (it prints a banner the first time)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


# ---- the heuristic -------------------------------------------------------------------------------

def heuristic(problem: Problem, memory: list[MemoryRow]) -> list[int]:
    """Iterated best responses from each choice's cheapest strategy (see the module
    docstring)."""
    assignment = [int(np.argmin(u)) for u in problem.unary]
    touching: dict[int, list] = {c: [] for c in range(problem.num_choices)}
    for p in problem.pairs:
        touching[p.u].append(p)
        touching[p.v].append(p)
    rows_of: dict[int, list[MemoryRow]] = {c: [] for c in range(problem.num_choices)}
    for m in memory:
        for c in set(m.terms) | {x for p in m.pair_terms
                                 for x in (problem.pairs[p].u, problem.pairs[p].v)}:
            rows_of[c].append(m)
    for _ in range(ROUNDS):
        changed = False
        for c in range(problem.num_choices):
            if problem.size(c) == 1:
                continue
            score = problem.unary[c].copy()
            for p in touching[c]:
                if p.u == c:
                    score += p.cost[:, p.groups_v[assignment[p.v]]][p.groups_u]
                else:
                    score += p.cost[p.groups_u[assignment[p.u]], :][p.groups_v]
            score += problem.shared_scores(c, assignment)
            for m in rows_of[c]:
                load = np.array([m.bytes(problem, assignment[:c] + [a] + assignment[c + 1:])
                                 for a in range(problem.size(c))])
                score += np.maximum(load - m.limit, 0.0) * (1.0 + score.max())
            best = int(np.argmin(score))
            if score[best] < score[assignment[c]] - 1e-15:
                assignment[c] = best
                changed = True
        if not changed:
            break
    return assignment


def _fits(problem: Problem, memory: list[MemoryRow], assignment: list[int]) -> bool:
    return all(m.bytes(problem, assignment) <= m.limit * (1 + 1e-9) for m in memory)


__all__ = ["MemoryRow", "Solution", "solve", "heuristic", "ROUNDS"]
