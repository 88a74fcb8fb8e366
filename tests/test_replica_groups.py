"""`ReplicaGroups` as a value: equal groups are equal and hash alike however they were built
(explicit tuples, an int64 array, a writable int32 array, a transposed view), and the hash,
which reads a sample of the device ids so that it costs the same at any device count, never
makes two different groupings one key."""
from __future__ import annotations

import numpy as np

from gspmdc.ir.attributes import ReplicaGroups


def _forms(array: np.ndarray) -> list[ReplicaGroups]:
    """The same groups built every way the parser and the partitioner build them."""
    frozen = np.array(array, dtype=np.int64)
    frozen.setflags(write=False)
    return [ReplicaGroups(tuple(map(tuple, array.tolist()))),
            ReplicaGroups.from_array(frozen),
            ReplicaGroups.from_array(np.array(array, dtype=np.int32)),
            ReplicaGroups.from_array(np.ascontiguousarray(array.T).T)]


def test_equal_groups_hash_alike_however_built():
    for array in (np.arange(8).reshape(2, 4), np.arange(8).reshape(4, 2, order="F"),
                  np.arange(64).reshape(8, 8), np.arange(72).reshape(8, 9)[::-1],
                  np.arange(4096).reshape(64, 64).T, np.arange(4096).reshape(1, 4096),
                  np.arange(4096).reshape(4096, 1)):
        forms = _forms(array)
        assert all(f == forms[0] for f in forms)
        assert len({hash(f) for f in forms}) == 1
        assert len(set(forms)) == 1


def test_groups_along_different_axes_differ():
    by_rows = ReplicaGroups.from_array(np.arange(4096).reshape(64, 64))
    by_columns = ReplicaGroups.from_array(np.arange(4096).reshape(64, 64).T.copy())
    assert by_rows != by_columns
    assert hash(by_rows) != hash(by_columns)


def test_groupings_the_sample_cannot_tell_apart_stay_distinct_keys():
    ids = np.arange(4096).reshape(64, 64)
    swapped = ids.copy()
    swapped[1, 1], swapped[1, 2] = ids[1, 2], ids[1, 1]     # a row the hash does not read
    a, b = ReplicaGroups.from_array(ids), ReplicaGroups.from_array(swapped)
    assert a != b
    assert len({a: "a", b: "b"}) == 2
    assert {a: "a", b: "b"}[ReplicaGroups.from_array(swapped.copy())] == "b"
