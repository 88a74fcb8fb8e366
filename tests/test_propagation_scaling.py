"""Structural checks behind the performance goals (the timings themselves are in
bench/bench_propagation.py): the driver's work is linear in the module size, and iota shardings
are never expanded into per-device arrays, so the device count does not matter."""
import sys
from pathlib import Path

import pytest

from gspmdc.ir import tile_assignment
from gspmdc.ir.parser import parse_module
from gspmdc.passes.propagation import driver, propagate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_propagation  # noqa: E402


def visits(layers: int, monkeypatch) -> int:
    count = [0]
    original = driver.Driver._visit

    def counting(self, *args):
        count[0] += 1
        return original(self, *args)

    monkeypatch.setattr(driver.Driver, "_visit", counting)
    propagate(parse_module(bench_propagation.transformer(layers, 2, 4), "t"),
              record_origins=False)
    monkeypatch.setattr(driver.Driver, "_visit", original)
    return count[0]


def test_work_grows_linearly_with_the_module(monkeypatch):
    small, large = visits(2, monkeypatch), visits(8, monkeypatch)
    assert large <= 4.2 * small


@pytest.mark.parametrize("mesh", [(2, 4), (64, 64)])
def test_iota_shardings_are_never_materialised(monkeypatch, mesh):
    module = parse_module(bench_propagation.transformer(2, *mesh), "t")

    def forbidden(*args):
        raise AssertionError("a tile assignment was expanded into a device array")

    monkeypatch.setattr(tile_assignment, "_iota_array", forbidden)
    propagate(module, record_origins=False)
    assert module.entry.root.operands[0].sharding.is_tiled


def _corpus_texts():
    texts = [pytest.param(bench_propagation.transformer(3, 2, 4), id="transformer")]
    corpus = Path(__file__).resolve().parents[2] / "shared" / "conformance" / \
        "xla-propagation.json"
    if corpus.is_file():
        import json
        texts += [pytest.param(case["hlo"], id=f"{case['name']}:{case['line']}")
                  for case in json.loads(corpus.read_text())["cases"]]
    return texts


@pytest.mark.parametrize("text", _corpus_texts())
def test_levels_resume_from_the_previous_fixpoint(monkeypatch, text):
    """Levels 2 and 3 start from what the previous level left dirty plus what the level enables
    (the broadcasts); restarting every level with every instruction dirty, as XLA's repeated
    sweeps do, gives the same shardings and the same origins."""
    from gspmdc.errors import GspmdcError
    from gspmdc.ir.printer import print_module

    def outcome():
        module = parse_module(text, "t")
        try:
            propagate(module, propagate_to_output=True)
        except GspmdcError as error:
            return f"{type(error).__name__}: {error}"
        return print_module(module)

    resumed = outcome()
    fixpoint = driver.Driver._fixpoint

    def restarting(self, level, groups, restart=True):
        return fixpoint(self, level, groups, restart=True)

    monkeypatch.setattr(driver.Driver, "_fixpoint", restarting)
    assert outcome() == resumed


_UNVISITED_SIBLING = """HloModule m, num_partitions=2

argmin {
  a = bf16[] parameter(0)
  ai = s32[] parameter(1)
  b = bf16[] parameter(2)
  bi = s32[] parameter(3)
  lt = pred[] compare(a, b), direction=LT
  v = bf16[] select(lt, a, b)
  i = s32[] select(lt, ai, bi)
  ROOT r = (bf16[], s32[]) tuple(v, i)
}

add {
  x = bf16[] parameter(0)
  y = bf16[] parameter(1)
  ROOT s = bf16[] add(x, y)
}

ENTRY main {
  one = bf16[] constant(1)
  lhs = bf16[4,4] broadcast(one), dimensions={}
  rhs = bf16[16] parameter(0), sharding={replicated}
  dot = bf16[4,4,16] dot(lhs, rhs), lhs_contracting_dims={}, rhs_contracting_dims={}
  iota = s32[4] iota(), iota_dimension=0
  index = s32[4,4,16] broadcast(iota), dimensions={1}
  big = bf16[] constant(inf)
  zero = s32[] constant(0)
  reduce = (bf16[4,16], s32[4,16]) reduce(dot, index, big, zero), dimensions={1}, to_apply=argmin
  values = bf16[4,16] get-tuple-element(reduce), index=0
  indices = s32[4,16] get-tuple-element(reduce), index=1
  v = bf16[4,16] reshape(values), sharding={replicated}
  i = s32[4,16] reshape(indices), sharding={devices=[2,1]1,0}
  base = bf16[1,4,3] parameter(1)
  where = s64[4,2] parameter(2), sharding={replicated}
  scatter = bf16[1,4,3] scatter(base, where, lhs), update_window_dims={1}, inserted_window_dims={0,2}, scatter_dims_to_operand_dims={2,0}, index_vector_dim=1, to_apply=add
  s = bf16[1,4,3] reshape(scatter), sharding={devices=[1,2,1]1,0}
  ROOT t = (bf16[4,16], s32[4,16], bf16[1,4,3]) tuple(values, indices, scatter), sharding={{replicated}, {devices=[2,1]1,0}, {devices=[1,2,1]1,0}}
}
"""


def test_a_level_visits_what_changed_before_its_first_sweep_got_there(monkeypatch):
    """Each level's first sweeps visit every instruction (XLA's caches start empty), so an
    instruction a level does not resume with is visited when something it reads changes before
    the sweep reaches it. Here at level 2 the backward sweep gives `index` (a broadcast) the
    reduce's tiling of its second output, [2,1,1]; `dot`, visited later in that sweep, then
    takes it through the reduce's merge of its other input (its own output is {replicated}),
    and `lhs` takes [2,1] from `dot`, its first user, before the scatter could give it [1,2]
    (XLA's propagation gives these shardings; restarting every level gives them too)."""
    def propagated():
        module = parse_module(_UNVISITED_SIBLING, "t")
        propagate(module, propagate_to_output=False)
        return {i.name: i.sharding and i.sharding.to_text(False)
                for i in module.entry.instructions}

    resumed = propagated()
    assert (resumed["index"], resumed["dot"], resumed["lhs"]) == \
        ("{devices=[2,1,1]1,0}", "{devices=[2,1,1]1,0}", "{devices=[2,1]1,0}")
    fixpoint = driver.Driver._fixpoint
    monkeypatch.setattr(driver.Driver, "_fixpoint",
                        lambda self, level, groups, restart=True:
                        fixpoint(self, level, groups, restart=True))
    assert propagated() == resumed


def _settled_texts():
    from fuzz import case
    texts = [pytest.param(*t.values, True, False, id=t.id) for t in _corpus_texts()]
    for seed in range(10230000000, 10230000000 + 120):
        c = case(seed)
        texts.append(pytest.param(c.text, c.propagate_to_output, c.propagate_to_parameters,
                                  id=f"fuzz/{seed}"))
    return texts


@pytest.mark.parametrize("text, to_output, to_parameters", _settled_texts())
def test_a_settled_forward_proposal_is_settled(monkeypatch, request, text, to_output,
                                               to_parameters):
    """A forward proposal marked `settled` (one candidate taken from no sharding), once applied,
    is answered with nothing by the instruction's forward rule asked again with the same
    operands, at the same level and every later one above 0: the claim that lets the driver
    skip that visit (docs/design/propagation.md#the-driver). The rule is asked again right
    after each such proposal, on the propagation corpus, the bench module and generated
    modules."""
    from gspmdc.errors import GspmdcError
    from gspmdc.ir.sharding_algebra import for_shape
    from gspmdc.passes.propagation.context import Context

    infer = driver.infer_from_operands
    settled = []

    def asking_again(ctx, inst):
        proposal = infer(ctx, inst)
        if proposal is not None and proposal.settled:
            settled.append(inst.name)
            saved, inst.sharding = inst.sharding, for_shape(proposal.sharding, inst.shape)
            try:
                for level in (range(ctx.level, 4) if ctx.level else (0,)):
                    again = infer(Context(ctx.graph, ctx.options, level), inst)
                    assert again is None, (inst.name, ctx.level, level, again)
            finally:
                inst.sharding = saved
        return proposal

    monkeypatch.setattr(driver, "infer_from_operands", asking_again)
    try:
        propagate(parse_module(text, "t"), propagate_to_output=to_output,
                  propagate_to_parameters=to_parameters)
    except GspmdcError:
        pass
    if request.node.callspec.id == "transformer":
        assert len(settled) >= 50       # most of its instructions get theirs that way


def test_only_one_candidate_taken_from_nothing_is_settled():
    """`settled` is the one case the argument covers: a single candidate taken, as given, by
    an instruction without a sharding; two candidates merged, a candidate improving a sharding
    the instruction had, or a rule whose candidate reads its own sharding, are not."""
    from gspmdc.ir.parser import parse_sharding
    from gspmdc.passes.propagation.context import Context, Options
    from gspmdc.passes.propagation.graph import ModuleGraph

    module = parse_module("""HloModule m, num_partitions=4
ENTRY e {
  a = f32[8,8] parameter(0)
  b = f32[8,8] parameter(1)
  ROOT c = f32[8,8] add(a, b)
}""", "m")
    c = module.entry.root
    ctx = Context(ModuleGraph(module), Options(), level=1)
    rows = parse_sharding("{devices=[2,1,2]<=[4] last_tile_dim_replicate}")
    cols = parse_sharding("{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}")
    maximal = parse_sharding("{maximal device=0}")
    tiled = parse_sharding("{devices=[2,2]<=[4]}")

    def proposal(current, *candidates, settled=True):
        c.sharding = current
        acc = ctx.accumulate(c)
        for candidate in candidates:
            acc.improve(candidate)
        return acc.result("test", settled)

    assert proposal(None, rows).settled
    assert proposal(None, maximal, rows).settled          # a candidate refused changes nothing
    assert not proposal(None, rows, settled=False).settled
    merged = proposal(None, rows, cols)
    assert merged.sharding.tile_counts == (2, 2) and not merged.settled
    assert not proposal(rows, cols).settled
    taken = proposal(rows, tiled)                          # taken as given, over a sharding
    assert taken.sharding == tiled and not taken.settled
