"""The "improve" decision of sharding propagation (passes/propagation/improve.py), on
hand-computed cases."""
from gspmdc.ir.parser import parse_sharding
from gspmdc.ir.shapes import ArrayShape
from gspmdc.ir.sharding_algebra import find_common_sharding
from gspmdc.passes.propagation.improve import improved_sharding

S = parse_sharding

SHAPE = ArrayShape("f32", (8, 8))


def improve(candidate, current, may_combine=True, aggressive=False):
    return improved_sharding(S(candidate), None if current is None else S(current), SHAPE,
                                 may_combine=may_combine, aggressive=aggressive)


def test_anything_beats_no_sharding_but_single_device_never_propagates():
    assert improve("{devices=[2,1]<=[2]}", None) == S("{devices=[2,1]<=[2]}")
    assert improve("{maximal device=1}", None) is None


def test_replicated_is_replaced_by_tiled():
    assert improve("{devices=[1,2]<=[2]}", "{replicated}") == S("{devices=[1,2]<=[2]}")


def test_same_tile_count_on_another_dim_is_not_a_refinement():
    assert improve("{devices=[1,2]<=[2]}", "{devices=[2,1]<=[2]}") is None
    # ... unless the single consumer pays for the reshard anyway
    assert improve("{devices=[1,4]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
                   aggressive=True) == S("{devices=[1,4]<=[4]}")


def test_partial_replication_is_refined_by_a_subtiling():
    assert improve("{devices=[2,2]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}") == \
        S("{devices=[2,2]<=[4]}")


def test_more_tiles_that_reshuffle_devices_are_rejected():
    # 4 tiles on dim 1, but device 1 would leave its row block
    assert improve("{devices=[1,4]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}") is None


def test_partial_shardings_on_different_dims_merge_only_when_allowed():
    rows = "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"
    cols = "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
    assert improve(cols, rows) == S("{devices=[2,2]<=[4]}")
    assert improve(cols, rows, may_combine=False) is None


def test_manual_beats_tile_maximal_and_is_never_replaced():
    assert improve("{manual}", "{replicated}") == S("{manual}")
    assert improve("{devices=[2,1]<=[2]}", "{manual}") is None


def test_find_common_sharding():
    rows = S("{devices=[2,1,2]<=[4] last_tile_dim_replicate}")
    cols = S("{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}")
    assert find_common_sharding([rows, cols]) == S("{devices=[2,2]<=[4]}")
    other = S("{devices=[1,4]<=[4]}")
    assert find_common_sharding([rows, other], cols) == cols
