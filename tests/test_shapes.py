"""Shapes as values: equality and hashing ignore nothing but what `==` ignores, and the hash an
array shape keeps survives a trip to another process (jobs are pickled to the ranks)."""
import os
import pickle
import subprocess
import sys

from gspmdc.ir.shapes import ArrayShape, TupleShape


def test_array_shape_hash_is_the_hash_of_its_fields():
    for shape in (ArrayShape("f32", (8, 16)), ArrayShape("bf16", (), None),
                  ArrayShape("s32", (4, 2), "0,1")):
        assert hash(shape) == hash((shape.element_type, shape.dims, shape.layout))
        assert shape == ArrayShape(shape.element_type, tuple(shape.dims), shape.layout)
    assert ArrayShape("f32", (2,), "0") != ArrayShape("f32", (2,))
    assert len({ArrayShape("f32", (2, 3)), ArrayShape("f32", (2, 3)),
                TupleShape((ArrayShape("f32", (2, 3)),))}) == 2


def test_array_shape_pickled_in_another_process_hashes_as_one_made_here():
    code = ("import pickle, sys; from gspmdc.ir.shapes import ArrayShape, TupleShape; "
            "sys.stdout.buffer.write(pickle.dumps(TupleShape((ArrayShape('f32', (8, 16)), "
            "ArrayShape('token', ())))))")
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    data = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}).stdout
    loaded = pickle.loads(data)
    here = TupleShape((ArrayShape("f32", (8, 16)), ArrayShape("token", ())))
    assert loaded == here
    assert [hash(e) for e in loaded.elements] == [hash(e) for e in here.elements]
    assert {here.elements[0]: 1}[loaded.elements[0]] == 1
