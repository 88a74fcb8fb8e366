"""gspmdc against XLA itself (`tests/conformance`): the pieces that need no XLA are checked
against hand-computed answers; with the `[xla]` extra installed, the oracle is checked against
numpy and a CI-sized sample of cases runs through the whole comparison, with today's agreement
figures as lower bounds (a ratchet: raise them as divergences get fixed)."""
from __future__ import annotations

import numpy as np
import pytest

from gspmdc import api
from gspmdc.ir.parser import parse_sharding

from conformance.correspondence import ABSENT, canonical, compare_shardings
from conformance.differential import Case, collective_bytes
from conformance.oracle import xla_available
from conformance.shrink import shrink, size
from hlo_text import reducer

needs_xla = pytest.mark.skipif(not xla_available(), reason="needs the [xla] extra (jax, jaxlib)")

SPMD = """HloModule spmd, num_partitions=4

""" + reducer("add") + """
ENTRY main {
  x = f32[2,8] parameter(0)
  g = f32[8,8] all-gather(x), channel_id=1, dimensions={0}, replica_groups={{0,1,2,3}}, use_global_device_ids=true
  r = f32[8,8] all-reduce(g), channel_id=2, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=add
  ROOT p = f32[8,8] collective-permute(r), channel_id=3, source_target_pairs={{0,1},{1,0},{2,2}}
}
"""


def test_collective_bytes_follow_the_ring_costs():
    # per device, averaged over the 4: all-gather: 3 other devices each receive my 64-byte piece
    # once: 3 * 64; all-reduce in pairs of 2 on 256 bytes: 2 * (2-1)/2 * 256; permute: devices 0
    # and 1 send 256 bytes, 2 keeps its value, 3 sends nothing: 2 * 256 / 4
    assert collective_bytes(SPMD, 4) == 3 * 64 + 256 + 2 * 256 / 4



def test_collective_bytes_are_summed_exactly():
    # per device, averaged over the 3: device 0 alone sends 4 bytes (4/3), the ring all-gather
    # 2 * 4, device 0 again 4/3: 32/3 exactly; summed as floats, 4/3 + 8 + 4/3 rounds to one
    # ulp above, so a program sending exactly what another sends would count as sending more
    text = """HloModule spmd, num_partitions=3

ENTRY main {
  x = f32[1] parameter(0)
  p = f32[1] collective-permute(x), channel_id=1, source_target_pairs={{0,1}}
  g = f32[3] all-gather(p), channel_id=2, dimensions={0}, replica_groups={{0,1,2}}, use_global_device_ids=true
  s = f32[1] slice(g), slice={[0:1]}
  ROOT q = f32[1] collective-permute(s), channel_id=3, source_target_pairs={{0,2}}
}
"""
    assert collective_bytes(text, 3) == 32 / 3

PROPAGATED = """HloModule m, num_partitions=4

ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[4,1]0,1,2,3}
  y = f32[8,4] negate(x), sharding={devices=[4,1]<=[4]}
  z = f32[8,4] exponential(y), sharding={devices=[1,1,4]<=[4] last_tile_dim_replicate}
  ROOT t = (f32[8,4], f32[8,4]) tuple(y, z), sharding={replicated}
}
"""


def test_canonical_shardings_compare_meaning_not_spelling():
    shape = api.parse(PROPAGATED).entry.root.shape
    assert canonical(parse_sharding("{replicated}"), shape) == \
        canonical(parse_sharding("{{replicated}, {replicated}}"), shape)
    leaf = shape.elements[0]
    assert canonical(parse_sharding("{devices=[4,1]0,1,2,3}"), leaf) == \
        canonical(parse_sharding("{devices=[4,1]<=[4]}"), leaf)
    assert canonical(parse_sharding("{devices=[1,1,4]<=[4] last_tile_dim_replicate}"), leaf) == \
        canonical(parse_sharding("{replicated}"), leaf)
    assert canonical(None, leaf) != canonical(parse_sharding("{replicated}"), leaf)


def test_correspondence_is_by_name_and_counts_what_one_side_lost():
    before = api.parse(PROPAGATED.replace(", sharding={devices=[4,1]<=[4]}", "")
                       .replace(", sharding={devices=[1,1,4]<=[4] last_tile_dim_replicate}", ""))
    ours = api.parse(PROPAGATED)
    theirs = api.parse(PROPAGATED.replace("exponential(y), sharding={devices=[1,1,4]<=[4] "
                                          "last_tile_dim_replicate}",
                                          "exponential(y), sharding={devices=[2,2]<=[4]}"))
    verdicts = {v.name: v for v in compare_shardings(before, ours, theirs)}
    assert verdicts["x"].agrees and verdicts["y"].agrees and verdicts["t"].agrees
    assert verdicts["z"].compared and not verdicts["z"].agrees
    theirs.entry.instructions.remove(theirs.entry.instruction("y"))
    lost = {v.name: v for v in compare_shardings(before, ours, theirs)}["y"]
    assert lost.xla == ABSENT and not lost.compared


BIG = """HloModule big, num_partitions=2

ENTRY main {
  a = f32[4,4] parameter(0), sharding={devices=[2,1]<=[2]}
  b = f32[4,4] parameter(1)
  c = f32[4,4] add(a, b)
  d = f32[4,4] dot(c, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[4,4] negate(d)
  f = f32[4,4] multiply(e, a)
  ROOT g = f32[4,4] subtract(f, c)
}
"""


def test_shrink_keeps_the_divergence_and_drops_the_rest():
    def has_dot(text: str) -> bool:
        return any(i.opcode == "dot" for _, i in api.parse(text).all_instructions())
    small = shrink(BIG, has_dot)
    assert has_dot(small)
    # the dot alone, on two parameters, is all that is left
    assert size(small) == 3, small
    assert "sharding" not in small


def test_shrink_returns_the_module_when_nothing_smaller_diverges():
    assert shrink(BIG, lambda text: text == BIG) == BIG


SORTED = """HloModule m, num_partitions=2
lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LT
}
ENTRY main {
  x = f32[4,8] parameter(0), sharding={devices=[1,2]<=[2]}
  ROOT s = f32[4,8] sort(x), dimensions={1}, to_apply=lt, sharding={devices=[1,2]<=[2]}
}
"""


def _deliberate(xla_text: str, before: str | None = None, options: bool = False) -> list[str]:
    """The known differences `deliberate.py` finds in a case whose XLA propagated module is
    `xla_text`, propagated from `before` (by default `xla_text` itself) with both options
    `options`."""
    from conformance.deliberate import deliberate_differences
    before = xla_text if before is None else before
    n = api.parse(before).num_partitions
    return deliberate_differences(before, Case("t", before, n, options, options),
                                  api.parse(xla_text))


def test_a_sort_xla_tiles_along_its_sort_dimension_is_a_deliberate_difference():
    from conformance.deliberate import SORT_ALONG_SORT_DIM
    assert _deliberate(SORTED) == [SORT_ALONG_SORT_DIM]
    other_dim = SORTED.replace("dimensions={1}", "dimensions={0}")
    assert _deliberate(other_dim) == []
    unsharded = SORTED.replace(", to_apply=lt, sharding={devices=[1,2]<=[2]}", ", to_apply=lt") \
        .replace("parameter(0), sharding={devices=[1,2]<=[2]}", "parameter(0)")
    assert _deliberate(unsharded) == []


def test_a_variadic_sort_with_one_result_tiled_along_the_sort_dimension_is_deliberate():
    """XLA may give a variadic sort's results different shardings (one taken back from a user,
    the other left replicated): one result tiled along the sort dim is enough."""
    from conformance.deliberate import SORT_ALONG_SORT_DIM
    text = """HloModule m, num_partitions=2
lt {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT r = pred[] compare(a, b), direction=LT
}
ENTRY main {
  x = s32[4,8] parameter(0)
  y = s32[4,8] parameter(1)
  ROOT s = (s32[4,8], s32[4,8]) sort(x, y), dimensions={1}, to_apply=lt, sharding={{replicated}, {devices=[1,2]<=[2]}}
}
"""
    assert _deliberate(text) == [SORT_ALONG_SORT_DIM]
    other = text.replace("{devices=[1,2]<=[2]}}", "{devices=[2,1]<=[2]}}")
    assert _deliberate(other) == []



def test_a_sort_whose_operand_xla_tiles_along_the_sort_dimension_is_deliberate():
    """XLA may keep an operand tiled along the sort dimension while the results take untiled
    shardings from their users (fuzz/9970001791, 9970002308): gspmdc's sort moves the operand's
    tiles, a deliberate difference too."""
    from conformance.deliberate import SORT_ALONG_SORT_DIM
    text = SORTED.replace("parameter(0), sharding={devices=[1,2]<=[2]}",
                          "parameter(0), sharding={devices=[1,2]<=[2]}\n  y = f32[4,8] negate(x)") \
        .replace("sort(x)", "sort(y)").replace("to_apply=lt, sharding={devices=[1,2]<=[2]}",
                                                "to_apply=lt, sharding={replicated}")
    assert "sort(y), dimensions={1}, to_apply=lt, sharding={replicated}" in text
    assert _deliberate(text.replace("negate(x)", "negate(x), sharding={devices=[1,2]<=[2]}")) == \
        [SORT_ALONG_SORT_DIM]
    assert _deliberate(text.replace("negate(x)", "negate(x), sharding={devices=[2,1]<=[2]}")) == []

TIE = """HloModule m, num_partitions=4
ENTRY main {
  p = f32[4,4] parameter(0)
  c = f32[4,4] copy(p)
  a = f32[4,4] abs(c), sharding={devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}
  e = f32[4,4] exponential(c), sharding={devices=[2,1,2]2,3,0,1 last_tile_dim_replicate}
  ROOT t = (f32[4,4], f32[4,4]) tuple(a, e)
}
"""
A_WANTS, E_WANTS = ("{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}",
                    "{devices=[2,1,2]2,3,0,1 last_tile_dim_replicate}")
#: `c` with the sharding its first user in text order (`a`) wants: gspmdc's answer
TIE_FIRST = TIE.replace("copy(p)", f"copy(p), sharding={A_WANTS}")


def test_a_tie_another_order_of_the_users_resolves_as_xla_did_is_a_users_order_tie():
    # XLA's answer takes the second user's sharding: gspmdc, given the users of c in the other
    # order, gives it; gspmdc's own answer is no difference at all
    from conformance.deliberate import USERS_ORDER_TIE
    second = TIE.replace("copy(p)", f"copy(p), sharding={E_WANTS}")
    assert _deliberate(second, TIE) == [USERS_ORDER_TIE]
    assert _deliberate(TIE_FIRST, TIE) == []


def test_a_difference_no_users_order_gives_is_not_a_users_order_tie():
    # a sharding neither user wants, and a tie resolved XLA's way beside another difference (the
    # parameter, which keeps no sharding with the options off): not explained by a users order
    assert _deliberate(TIE.replace("copy(p)", "copy(p), sharding={devices=[4,1]<=[4]}"), TIE) == []
    both = TIE.replace("parameter(0)", "parameter(0), sharding={devices=[4,1]<=[4]}") \
        .replace("copy(p)", f"copy(p), sharding={E_WANTS}")
    assert _deliberate(both, TIE) == []


#: fuzz/9700009805 with both options on: the module XLA's propagation started from and XLA's
#: propagated module (jax 0.10.2; metadata dropped). param.6's users are sine.1, then the root in
#: text order; XLA gives param.6 the root's sharding, gspmdc sine.1's.
RECORDED_TIE_BEFORE = """HloModule fuzz, entry_computation_layout={(f64[4]{0}, f32[10,2]{1,0}, pred[3,6,7,2]{3,2,1,0}, s32[3]{0}, f32[6,8,8,2]{3,2,1,0})->(f32[10,2]{1,0}, f32[6,8]{1,0}, f32[10,2]{1,0})}, allow_spmd_sharding_propagation_to_parameters={true}, allow_spmd_sharding_propagation_to_output={true}, num_partitions=6

%region_1.3 (reduce.2: f32[], reduce.3: f32[]) -> f32[] {
  %reduce.2 = f32[] parameter(0)
  %reduce.3 = f32[] parameter(1)
  ROOT %r.3 = f32[] maximum(%reduce.2, %reduce.3)
}

ENTRY %main.4 (param.5: f64[4], param.6: f32[10,2], param.7: pred[3,6,7,2], param.8: s32[3], param.9: f32[6,8,8,2]) -> (f32[10,2], f32[6,8], f32[10,2]) {
  %param.5 = f64[4]{0} parameter(0)
  %param.7 = pred[3,6,7,2]{3,2,1,0} parameter(2)
  %param.8 = s32[3]{0} parameter(3)
  %param.6 = f32[10,2]{1,0} parameter(1)
  %param.9 = f32[6,8,8,2]{3,2,1,0} parameter(4)
  %constant.5 = f32[] constant(-inf)
  %reduce.5 = f32[6,8]{1,0} reduce(%param.9, %constant.5), dimensions={1,3}, to_apply=%region_1.3
  %tanh.1 = f32[6,8]{1,0} tanh(%reduce.5)
  %sine.1 = f32[10,2]{1,0} sine(%param.6), sharding={devices=[6,1]2,4,0,3,5,1}
  ROOT %tuple.1 = (f32[10,2]{1,0}, f32[6,8]{1,0}, f32[10,2]{1,0}) tuple(%param.6, %tanh.1, %sine.1), sharding={{devices=[6,1]<=[2,3]T(1,0)}, {devices=[2,3]<=[2,3]T(1,0)}, {devices=[1,2,3]2,3,5,0,1,4 last_tile_dim_replicate}}
}
"""
RECORDED_TIE_XLA = """HloModule fuzz, entry_computation_layout={(f64[4]{0}, f32[10,2]{1,0}, pred[3,6,7,2]{3,2,1,0}, s32[3]{0}, f32[6,8,8,2]{3,2,1,0})->(f32[10,2]{1,0}, f32[6,8]{1,0}, f32[10,2]{1,0})}, allow_spmd_sharding_propagation_to_parameters={true}, allow_spmd_sharding_propagation_to_output={true}, num_partitions=6

%region_1.3 (reduce.2: f32[], reduce.3: f32[]) -> f32[] {
  %reduce.2 = f32[] parameter(0)
  %reduce.3 = f32[] parameter(1)
  ROOT %r.3 = f32[] maximum(%reduce.2, %reduce.3)
}

ENTRY %main.4 (param.5: f64[4], param.6: f32[10,2], param.7: pred[3,6,7,2], param.8: s32[3], param.9: f32[6,8,8,2]) -> (f32[10,2], f32[6,8], f32[10,2]) {
  %param.5 = f64[4]{0} parameter(0)
  %param.7 = pred[3,6,7,2]{3,2,1,0} parameter(2)
  %param.8 = s32[3]{0} parameter(3)
  %param.6 = f32[10,2]{1,0} parameter(1), sharding={devices=[6,1]<=[2,3]T(1,0)}
  %param.9 = f32[6,8,8,2]{3,2,1,0} parameter(4), sharding={devices=[2,1,3,1]<=[2,3]T(1,0)}
  %constant.5 = f32[] constant(-inf)
  %reduce.5 = f32[6,8]{1,0} reduce(%param.9, %constant.5), dimensions={1,3}, to_apply=%region_1.3, sharding={devices=[2,3]<=[2,3]T(1,0)}
  %tanh.1 = f32[6,8]{1,0} tanh(%reduce.5), sharding={devices=[2,3]<=[2,3]T(1,0)}
  %sine.1 = f32[10,2]{1,0} sine(%param.6), sharding={devices=[6,1]2,4,0,3,5,1}
  ROOT %tuple.1 = (f32[10,2]{1,0}, f32[6,8]{1,0}, f32[10,2]{1,0}) tuple(%param.6, %tanh.1, %sine.1), sharding={{devices=[6,1]<=[2,3]T(1,0)}, {devices=[2,3]<=[2,3]T(1,0)}, {devices=[6,1]2,4,0,3,5,1}}
}
"""


def test_xlas_recorded_users_order_tie_is_classified():
    from conformance.deliberate import USERS_ORDER_TIE
    from conformance.differential import _gspmdc_compile
    case = Case("fuzz/9700009805 [on]", RECORDED_TIE_BEFORE, 6, True, True)
    ours, _ = _gspmdc_compile(RECORDED_TIE_BEFORE, case, partition=False)
    verdicts = compare_shardings(api.parse(RECORDED_TIE_BEFORE), api.parse(ours, verify=False),
                                 api.parse(RECORDED_TIE_XLA, verify=False))
    assert [v.name for v in verdicts if v.compared and not v.agrees] == ["param.6"]
    assert _deliberate(RECORDED_TIE_XLA, RECORDED_TIE_BEFORE, True) == [USERS_ORDER_TIE]
    # with the options off the parameter keeps no sharding whatever the order: not a tie
    assert _deliberate(RECORDED_TIE_XLA, RECORDED_TIE_BEFORE, False) == []


def test_a_result_propagated_manual_has_no_global_value_to_compare():
    """With propagation to the output, a `{manual}` constant that is also an output makes that
    output manual (XLA agrees): each device returns its own value, so values are not compared."""
    from conformance.differential import _no_global_result
    text = """HloModule m, num_partitions=2

ENTRY main {
  x = f32[4] parameter(0), sharding={devices=[2]<=[2]}
  c = f32[] constant(0.5), sharding={manual}
  ROOT t = (f32[4], f32[]) tuple(x, c), sharding={{devices=[2]<=[2]}, {SHARDING}}
}
"""
    assert "{manual}" in _no_global_result(api.parse(text.replace("SHARDING", "manual")), 2)
    assert _no_global_result(api.parse(text.replace("SHARDING", "replicated")), 2) is None


# ---- with XLA ----------------------------------------------------------------------------------

@needs_xla
def test_oracle_propagates_partitions_and_runs_like_numpy():
    from conformance.oracle import XlaOracle
    text = """HloModule m

ENTRY main {
  x = f32[8,16] parameter(0), sharding={devices=[2,1]<=[2]}
  w = f32[16,6] parameter(1), sharding={replicated}
  ROOT d = f32[8,6] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 6), np.float32)
    with XlaOracle() as xla:
        answer = xla.partition(text, 2, to_output=True, to_parameters=False, inputs=[x, w],
                               output_shapes=[(8, 6)])
        assert answer.ok, answer.error
        root = api.parse(answer.propagated, verify=False).entry.root
        assert root.sharding == parse_sharding("{devices=[2,1]<=[2]}")
        assert "f32[4,16]" in answer.spmd               # per-partition shapes
        np.testing.assert_allclose(answer.outputs[0], x @ w, rtol=1e-5, atol=1e-5)
        bad = xla.partition("HloModule bad\nENTRY e {\n ROOT x = f32[] parametr(0)\n}\n", 2,
                            to_output=False, to_parameters=False)
        assert not bad.ok and bad.stage == "compile"


@needs_xla
def test_an_xla_crash_is_reported_and_the_worker_replaced():
    from conformance.oracle import XlaOracle
    # XLA 0.10.2 fails an internal check on a tuple sharding of an outfeed's token
    crash = """HloModule crash

ENTRY main {
  p = f32[4,8] parameter(0)
  t = (f32[4,8]) tuple(p)
  a = token[] after-all()
  ROOT of = token[] outfeed(t, a), outfeed_shape=(f32[4,8]), sharding={{devices=[2,1]0,1}, {maximal device=0}}
}
"""
    ok = "HloModule ok\n\nENTRY main {\n  ROOT p = f32[4] parameter(0), sharding={replicated}\n}\n"
    with XlaOracle() as xla:
        answer = xla.partition(crash, 2, to_output=False, to_parameters=False)
        assert not answer.ok and answer.stage == "crash", answer
        assert "Check failed" in answer.error
        assert xla.partition(ok, 2, to_output=False, to_parameters=False).ok


@needs_xla
def test_shardings_only_gives_the_sharding_figures_of_a_full_run():
    # `--shardings-only` skips partitioning and the runs; every case's sharding comparison must
    # be the full run's, and no bytes or values may be claimed
    from conformance.oracle import XlaOracle
    from conformance.sources import fuzz_cases
    from conformance.xla import run_all
    modules, seed = 8, 11
    with XlaOracle() as xla:
        full = run_all(fuzz_cases(modules, seed), xla, seed)
        only = run_all(fuzz_cases(modules, seed), xla, seed, shardings_only=True)
    assert [r.name for r in only] == [r.name for r in full]
    compared = 0
    for a, b in zip(full, only):
        assert (b.status, b.instructions, b.agreeing, b.absent, b.differing, b.deliberate) == \
            (a.status, a.instructions, a.agreeing, a.absent, a.differing, a.deliberate), a.name
        assert [c for c in b.classes if c[0] in ("sharding", "deliberate")] == \
            [c for c in a.classes if c[0] in ("sharding", "deliberate")]
        assert b.our_bytes is None and not b.spmd_made and not b.value_mismatch
        if b.status == "compared":
            compared += 1
            assert b.values == "not run: shardings only"
    assert compared >= modules        # both settings of at least half the modules


# ---- the CI sample: generated modules against XLA, today's figures as lower bounds -----------

SAMPLE_MODULES = 100            # each under both option settings
SAMPLE_SEED = 0
#: today's figures per setting ("off": propagation to outputs/parameters off, "on": on), rounded
#: down; raise them as divergences get fixed (a ratchet), re-measure them when the generator
#: changes the sample. gspmdc's values must always agree with the reference.
# measured: off 100.0% / 100.0% / 69 of 77; on 100.0% / 100.0% / 69 of 77 (was off 99.5% /
# 94.9%, on 92.4% / 28.2% before propagation followed jax 0.10.2's XLA: entry flag line-up,
# user-level backward gate, barrier removal, gather passthrough, aggressive concatenate). The
# floors keep a margin: a sort along a sharded dim (a deliberate difference, docs/propagation.md)
# costs a module, and the generator's sample moved with main's generator change.
# Bytes are counted by the one cost model (ir/cost.py: each device's exact bytes, averaged), for both programs; since it
# replaced the uniform ring formulas, XLA's program of fuzz/61 counts 110 bytes where gspmdc's
# counts 112 (both were 112), the one module that moved. Bytes not more than XLA's: 74 of 77
# in both settings since values are had without communication where XLA has them so
# (docs/partitioning.md, "Recomputing instead of resharding"; was 69 of 77). Judged by the
# busiest device's bytes, then the mean, without the modules whose XLA values are wrong (session
# 15): 75 of 75 off (fuzz/65 and fuzz/88 off: XLA's values wrong, not judged), 77 of 77 on.
FLOORS = {
    "off": {"instruction_agreement": 0.99, "module_agreement": 0.95, "bytes_not_more": 0.95},
    "on": {"instruction_agreement": 0.99, "module_agreement": 0.95, "bytes_not_more": 0.95},
}


@pytest.fixture(scope="module")
def sample_figures():
    if not xla_available():
        pytest.skip("needs the [xla] extra (jax, jaxlib)")
    from conformance.oracle import XlaOracle
    from conformance.sources import fuzz_cases
    from conformance.xla import figures_by_setting, run_all
    with XlaOracle() as xla:
        results = run_all(fuzz_cases(SAMPLE_MODULES, SAMPLE_SEED), xla, SAMPLE_SEED)
    return figures_by_setting(results)


@pytest.mark.parametrize("setting", ["off", "on"])
def test_sample_against_xla(sample_figures, setting, capsys):
    figures = sample_figures[setting]
    with capsys.disabled():
        print(f"\nconformance-xla sample ({SAMPLE_MODULES} modules, seed {SAMPLE_SEED}), "
              f"propagation to outputs/parameters {setting}:")
        for line in figures.lines():
            print("  " + line)
    floors = FLOORS[setting]
    assert figures.xla_partitioned >= SAMPLE_MODULES // 2, "XLA partitioned too few modules"
    assert figures.status["gspmdc-crashed"] == 0, figures.lines()
    assert figures.values.compared > 0 and figures.gspmdc_value_agreement == 1.0, figures.lines()
    assert figures.instruction_agreement >= floors["instruction_agreement"], figures.lines()
    assert figures.module_agreement >= floors["module_agreement"], figures.lines()
    not_more = 1 - figures.bytes_more / figures.bytes_compared if figures.bytes_compared else 1.0
    assert not_more >= floors["bytes_not_more"], figures.lines()


@needs_xla
def test_a_users_order_tie_of_the_random_modules_is_classified_in_the_run():
    # fuzz/9700009805 [on] (RECORDED_TIE_*): XLA still answers so and the run classes the case
    from conformance.deliberate import USERS_ORDER_TIE
    from conformance.differential import run_case
    from conformance.oracle import XlaOracle
    from conformance.sources import fuzz_cases
    case, = [c for c in fuzz_cases(9806, 9700, (9805, 10000)) if c.propagate_to_output]
    with XlaOracle() as xla:
        result = run_case(case, xla, 9700, shardings_only=True)
    assert [v.name for v in result.compared_shardings if not v.agrees] == ["param.6"]
    assert result.deliberate == [USERS_ORDER_TIE]


def test_the_harness_takes_xlas_module_before_propagation_as_global():
    """XLA's partitioner takes every module as global: a cross-partition all-reduce outside
    manual regions, which alone would mark a module partitioned, is partitioned replicated (each
    partition sums its gathered copy), and with propagation to the output, which gives it its
    operand's tiling, refused (as XLA refuses it)."""
    from conformance.differential import _gspmdc_compile
    from gspmdc.errors import UnsupportedError
    text = f"""HloModule m, num_partitions=2
{reducer('add')}
ENTRY e {{
  p = f32[4,2] parameter(0), sharding={{devices=[2,1]<=[2]}}
  ROOT r = f32[4,2] all-reduce(p), channel_id=1, replica_groups={{{{0,1}}}},
    use_global_device_ids=true, to_apply=add
}}
"""
    _, spmd = _gspmdc_compile(text, Case("m", text, 2, False, False))
    assert [i.opcode for i in spmd.entry.instructions if i.opcode in ("all-gather", "all-reduce")] \
        == ["all-gather", "all-reduce"]
    with pytest.raises(UnsupportedError, match="must be replicated"):
        _gspmdc_compile(text, Case("m", text, 2, True, True))
