"""Shardy's op sharding rules for HLO instructions: which *factors* each dimension of each operand
and result is made of.

A rule is an `OpShardingRule` (`ir/sdy.py`): factor sizes, and per operand / result a list per
dimension of the factors it is made of (major to minor). A dot `[i,k] x [k,j] -> [i,j]` has three
factors; a reshape `f32[8] -> f32[2,4]` has two, the input dimension being `(i j)`. Factors have a
kind: *pass-through* (the default: sharding it costs nothing), *reduction* (sharding it leaves
partial results to reduce, e.g. a contracting dimension), *need-replication* (the op needs the
whole factor, e.g. a sort dimension) and *permutation* (sharding it needs data exchanged, e.g. a
padded dimension); a *blocked* factor does not propagate at all.

`RULES` maps an opcode to the function building its rule from the instruction (None: no rule,
the op does not propagate); elementwise opcodes share one entry. `rule_of(inst)` also honours a
user rule written as `xla.sdy.sharding_rule`. The rules follow Shardy's registry for the
corresponding StableHLO ops (docs/design/shardy.md lists them).
"""
from __future__ import annotations

from typing import Callable

from gspmdc.ir import ops
from gspmdc.ir.module import Instruction
from gspmdc.ir.sdy import SHARDING_RULE, OpShardingRule, frontend
from gspmdc.ir.shape_rules_common import attr_ints

__all__ = ["rule_of", "RULES", "RuleBuilder", "identity_rule", "is_elementwise"]

PASS, REDUCTION, REPLICATION, PERMUTATION = "pass", "reduction", "need_replication", "permutation"

#: opcodes whose rule maps every dimension of every operand and result to the same factor: the
#: catalogue's typed elementwise ops (a new one is pointwise here without a line of its own) and
#: these
_POINTWISE = ops.TYPED_ELEMENTWISE | ops.opcodes(
    "all-reduce", "collective-broadcast", "collective-permute", "compare", "complex", "convert",
    "reduce-precision", "select", "clamp")
#: ops Shardy treats as elementwise when it orders factors and schedules ops
_ELEMENTWISE = (_POINTWISE - {"all-reduce", "collective-broadcast", "collective-permute"})
#: custom-call targets whose operands and results correspond dimension for dimension
_POINTWISE_TARGETS = frozenset({
    "Sharding", "annotate_device_placement", "Cholesky", "CompactWyHelper", "InspectSharding",
    "InvertDiagBlocksLowerTriangular", "InvertDiagBlocksUpperTriangular", "LayoutConstraint",
    "mhlo.erf", "MoveToDevice", "MoveToHost", "X64SplitHigh", "X64SplitLow",
    "xla.megascale.provide_metadata", "_SPMDInternalOp_MultiPad", "_SPMDInternalOp_RotateRight",
    "_SPMDInternalOp_MultiRotate", "_SPMDInternalOp_MultiSlice", "_SPMDInternalOp_Wrap",
    "xla.sdy.PropagationBarrier",
})


def _leaves(shape) -> list:
    return list(shape.leaves())


def is_elementwise(inst: Instruction) -> bool:
    """Elementwise for Shardy's scheduling and factor ordering (sharding constraints and
    propagation barriers count; bitcast-converts only between equal widths)."""
    if inst.opcode in _ELEMENTWISE:
        return True
    if inst.opcode == "bitcast-convert":
        return inst.operands[0].shape.dims == inst.shape.dims
    return inst.opcode == "custom-call" and \
        inst.attrs.get("custom_call_target") in ("Sharding", "xla.sdy.PropagationBarrier")


class RuleBuilder:
    """Builds a rule factor by factor. A dimension given as None is not mapped to the factor; a
    dimension left without any factor gets its own factor of size 1 at `build()`."""

    def __init__(self, operand_ranks, result_ranks):
        self.operands = [[[] for _ in range(r)] for r in operand_ranks]
        self.results = [[[] for _ in range(r)] for r in result_ranks]
        self.sizes: list[int] = []
        self.kinds: dict[str, list[int]] = {REDUCTION: [], REPLICATION: [], PERMUTATION: []}
        self.blocked: list[int] = []

    @classmethod
    def of(cls, inst: Instruction) -> "RuleBuilder":
        return cls([leaf.rank for o in inst.operands for leaf in _leaves(o.shape)],
                   [leaf.rank for leaf in _leaves(inst.shape)])

    def _new(self, size: int, kind: str, blocked: bool) -> int:
        index = len(self.sizes)
        self.sizes.append(size)
        if kind != PASS:
            self.kinds[kind].append(index)
        if blocked:
            self.blocked.append(index)
        return index

    def factor(self, operand_dims, result_dims, size: int, kind: str = PASS,
               blocked: bool = False) -> "RuleBuilder":
        """A factor on dimension `operand_dims[t]` of operand t (None: not on it), likewise for
        results; a size-1 factor is not added to a dimension that already has one."""
        index = self._new(size, kind, blocked)
        for tensors, dims in ((self.operands, operand_dims), (self.results, result_dims)):
            for tensor, dim in zip(tensors, dims):
                if dim is None or (size == 1 and tensor[dim]):
                    continue
                tensor[dim].append(index)
        return self

    def factor_everywhere(self, dim: int, size: int, kind: str = PASS, blocked: bool = False,
                          operands: bool = True, results: bool = True) -> "RuleBuilder":
        """A factor on dimension `dim` of every (non-scalar) operand and/or result."""
        index = self._new(size, kind, blocked)
        for tensors, wanted in ((self.operands, operands), (self.results, results)):
            if wanted:
                for tensor in tensors:
                    if tensor:
                        tensor[dim].append(index)
        return self

    def pointwise(self, shape, kind_of=lambda d: PASS, blocked_of=lambda kind: False):
        for dim, size in enumerate(shape):
            kind = kind_of(dim)
            self.factor_everywhere(dim, size, kind, blocked_of(kind))
        return self

    def build(self) -> OpShardingRule:
        sizes = list(self.sizes)

        def mappings(tensors):
            out = []
            for tensor in tensors:
                dims = []
                for factors in tensor:
                    if not factors:
                        factors = [len(sizes)]
                        sizes.append(1)
                    dims.append(tuple(factors))
                out.append(tuple(dims))
            return tuple(out)

        operands, results = mappings(self.operands), mappings(self.results)
        return OpShardingRule(tuple(sizes), operands, results, tuple(self.kinds[REDUCTION]),
                              tuple(self.kinds[REPLICATION]), tuple(self.kinds[PERMUTATION]),
                              tuple(self.blocked))


def identity_rule(dims, operands: int = 1, results: int = 1) -> OpShardingRule:
    """Every operand and result the same shape, dimension d the factor d (data-flow edges)."""
    builder = RuleBuilder([len(dims)] * operands, [len(dims)] * results)
    return builder.pointwise(dims).build()


# ---------------------------------------------------------------------------------- the rules

def _pointwise(inst):
    leaves = _leaves(inst.shape)
    if not leaves or leaves[0].element_type == "token":
        return None
    return RuleBuilder.of(inst).pointwise(leaves[0].dims).build()


def _mismatch_blocked(inst, in_dims, out_dims, kind=REPLICATION, blocked=True):
    """Dimension d of every operand and result is factor d, of the operand's size; where the
    operand and result sizes differ the factor is of `kind`, and blocked when asked."""
    b = RuleBuilder.of(inst)
    for dim, (i, o) in enumerate(zip(in_dims, out_dims)):
        if i == o:
            b.factor_everywhere(dim, i)
        else:
            b.factor_everywhere(dim, i, kind, blocked)
    return b.build()


def _all_gather_like(inst, dim_attr):
    dim = attr_ints(inst, dim_attr)[0]
    in_shape, out_shape = inst.operands[0].shape, _leaves(inst.shape)[0]
    b = RuleBuilder.of(inst)
    for d, size in enumerate(in_shape.dims):
        if d != dim:
            b.factor_everywhere(d, size)
    b.factor_everywhere(dim, in_shape.dims[dim], REPLICATION, results=False)
    b.factor_everywhere(dim, out_shape.dims[dim], REPLICATION, operands=False)
    return b.build()


def _all_to_all(inst):
    """The array form moves data along `dimensions` as all-gather does (the tuple form has no
    rule)."""
    return _all_gather_like(inst, "dimensions") if "dimensions" in inst.attrs else None


def _bitcast_convert(inst):
    in_dims, out_dims = inst.operands[0].shape.dims, inst.shape.dims
    shape = in_dims if len(in_dims) < len(out_dims) else out_dims
    b = RuleBuilder.of(inst).pointwise(shape)
    if len(in_dims) < len(out_dims):
        b.factor([None], [len(out_dims) - 1], out_dims[-1], REPLICATION)
    elif len(in_dims) > len(out_dims):
        b.factor([len(in_dims) - 1], [None], in_dims[-1], REPLICATION)
    return b.build()


def _broadcast(inst):
    operand = inst.operands[0].shape
    in_of_out = {o: i for i, o in enumerate(attr_ints(inst, "dimensions"))}
    b = RuleBuilder.of(inst)
    for out_dim, size in enumerate(inst.shape.dims):
        in_dim = in_of_out.get(out_dim)
        if in_dim is not None and operand.dims[in_dim] == 1 and size != 1:
            b.factor([in_dim], [None], 1)
            in_dim = None
        b.factor([in_dim], [out_dim], size)
    return b.build()


def _cholesky(inst):
    dims = inst.shape.dims
    batch = len(dims) - 2
    return RuleBuilder.of(inst).pointwise(
        dims, lambda d: PASS if d < batch else REPLICATION).build()


def _clamp(inst):
    return RuleBuilder.of(inst).pointwise(inst.operands[1].shape.dims).build()


def _concatenate(inst):
    dim = attr_ints(inst, "dimensions")[0]
    sliced = [o.opcode == "slice" for o in inst.operands]
    source = [o.operands[0] if o.opcode == "slice" else o for o in inst.operands]
    if all(sliced) or (all(s is source[0] for s in source) and any(sliced)):
        kind = PERMUTATION
    else:
        kind = REPLICATION
    return RuleBuilder.of(inst).pointwise(
        inst.shape.dims, lambda d: PASS if d != dim else kind).build()


def _convolution(inst):
    labels = inst.attrs["dim_labels"]
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    out = inst.shape
    feature_groups = inst.attrs.get("feature_group_count", 1)
    batch_groups = inst.attrs.get("batch_group_count", 1)
    b = RuleBuilder.of(inst)
    if batch_groups > 1:
        b.factor([labels.lhs_batch, labels.rhs_output_feature], [labels.out_feature],
                 batch_groups)
    b.factor([labels.lhs_batch, None], [labels.out_batch], out.dims[labels.out_batch])
    for lhs_dim, rhs_dim, out_dim in zip(labels.lhs_spatial, labels.rhs_spatial,
                                         labels.out_spatial):
        windows, window, remaining = out.dims[out_dim], rhs.dims[rhs_dim], lhs.dims[lhs_dim]

        def spatial(size, contracting, remaining):
            size = min(remaining, size)
            if size > 1:
                b.factor([lhs_dim, rhs_dim if contracting else None],
                         [None if contracting else out_dim], size,
                         REDUCTION if contracting else PERMUTATION)
                remaining //= size
            return remaining

        if windows >= window:
            remaining = spatial(windows, False, remaining)
            spatial(window, True, remaining)
        else:
            remaining = spatial(window, True, remaining)
            spatial(windows, False, remaining)
    if feature_groups > 1:
        b.factor([labels.lhs_feature, labels.rhs_output_feature], [labels.out_feature],
                 feature_groups)
    b.factor([labels.lhs_feature, labels.rhs_input_feature], [None],
             rhs.dims[labels.rhs_input_feature], REDUCTION)
    out_features = out.dims[labels.out_feature] // (batch_groups * feature_groups)
    if out_features > 1:
        b.factor([None, labels.rhs_output_feature], [labels.out_feature], out_features)
    return b.build()


def _custom_call(inst):
    target = inst.attrs.get("custom_call_target")
    if target in _POINTWISE_TARGETS:
        return _pointwise(inst)
    if target in ("TopK", "mhlo.topk"):
        return _mismatch_blocked(inst, inst.operands[0].shape.dims, _leaves(inst.shape)[0].dims)
    return None


def _dot(inst):
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    lb, rb = attr_ints(inst, "lhs_batch_dims", ()), attr_ints(inst, "rhs_batch_dims", ())
    lc = attr_ints(inst, "lhs_contracting_dims", ())
    rc = attr_ints(inst, "rhs_contracting_dims", ())
    b = RuleBuilder.of(inst)
    out = 0
    for ld, rd in zip(lb, rb):
        b.factor([ld, rd], [out], lhs.dims[ld])
        out += 1
    for d in range(lhs.rank):
        if d not in lc and d not in lb:
            b.factor([d, None], [out], lhs.dims[d])
            out += 1
    for d in range(rhs.rank):
        if d not in rc and d not in rb:
            b.factor([None, d], [out], rhs.dims[d])
            out += 1
    for ld, rd in zip(lc, rc):
        b.factor([ld, rd], [None], lhs.dims[ld], REDUCTION)
    return b.build()


def _dynamic_slice(inst):
    return _mismatch_blocked(inst, inst.operands[0].shape.dims, inst.shape.dims)


def _dynamic_update_slice(inst):
    operand, update = inst.operands[0].shape, inst.operands[1].shape
    n = len(inst.operands)
    constant = all(o.opcode == "constant" for o in inst.operands[2:])
    b = RuleBuilder.of(inst)
    for dim, (o, u) in enumerate(zip(operand.dims, update.dims)):
        if o == u:
            b.factor([dim, dim] + [None] * (n - 2), [dim], o)
        else:
            b.factor([dim, None] + [None] * (n - 2), [dim], o)
            b.factor([None, dim] + [None] * (n - 2), [None], u,
                     PASS if constant else REPLICATION)
    return b.build()


def _fft(inst):
    in_dims, out_dims = inst.operands[0].shape.dims, inst.shape.dims
    lengths = len(attr_ints(inst, "fft_length"))
    b = RuleBuilder.of(inst)
    for dim, size in enumerate(in_dims):
        if dim < len(in_dims) - lengths:
            b.factor_everywhere(dim, size)
        elif dim < len(in_dims) - 1:
            b.factor_everywhere(dim, size, REPLICATION)
        else:
            b.factor_everywhere(dim, size, REPLICATION, blocked=in_dims[-1] != out_dims[-1])
    return b.build()


def _gather_scatter_factors(add, is_scatter, input_shape, slices_shape, indices_shape,
                            index_vector_dim, offset_dims, collapsed, input_batching,
                            indices_batching, scatter_kind):
    """The factors of a gather (slices = result) or scatter (slices = updates); `add(input_dim,
    indices_dim, slices_dim, size, kind, blocked)`."""
    input_dim, batch_pos = 0, 0
    for slices_dim, slices_size in enumerate(slices_shape.dims):
        if slices_dim in offset_dims:
            while input_dim in collapsed or input_dim in input_batching:
                input_dim += 1
            input_size = input_shape.dims[input_dim]
            if input_size == slices_size:
                add(input_dim, None, slices_dim, input_size, PASS, False)
            elif is_scatter:
                add(input_dim, None, None, input_size, REPLICATION, False)
                add(None, None, slices_dim, slices_size, REPLICATION, False)
            elif slices_size == 1:
                add(input_dim, None, None, input_size, REDUCTION, False)
                add(None, None, slices_dim, slices_size, REPLICATION, False)
            else:
                add(input_dim, None, slices_dim, input_size, REPLICATION, True)
            input_dim += 1
        else:
            indices_dim = batch_pos if batch_pos < index_vector_dim else batch_pos + 1
            explicit = indices_dim in indices_batching
            input_batch = input_batching[indices_batching.index(indices_dim)] if explicit else None
            kind = scatter_kind if is_scatter and not explicit else PASS
            add(input_batch, indices_dim, slices_dim, slices_size, kind, False)
            batch_pos += 1
    for dim in collapsed:
        size = input_shape.dims[dim]
        kind = PASS if is_scatter else (REPLICATION if size == 1 else REDUCTION)
        add(dim, None, None, size, kind, False)
    if index_vector_dim < indices_shape.rank:
        add(None, index_vector_dim, None, indices_shape.dims[index_vector_dim], REPLICATION,
            False)


def _gather(inst):
    b = RuleBuilder.of(inst)

    def add(input_dim, indices_dim, slices_dim, size, kind, blocked):
        b.factor([input_dim, indices_dim], [slices_dim], size, kind, blocked)

    _gather_scatter_factors(
        add, False, inst.operands[0].shape, inst.shape, inst.operands[1].shape,
        inst.attrs["index_vector_dim"], attr_ints(inst, "offset_dims"),
        attr_ints(inst, "collapsed_slice_dims", ()), attr_ints(inst, "operand_batching_dims", ()),
        attr_ints(inst, "start_indices_batching_dims", ()), PASS)
    return b.build()


_REDUCERS = frozenset({"add", "multiply", "maximum", "minimum", "and", "or"})


def _scatter(inst, combiner: str | None):
    """`combiner`: the opcode combining old and new values (None when the scatter's computation
    is not a single binary op of its parameters)."""
    n = (len(inst.operands) - 1) // 2
    b = RuleBuilder.of(inst)

    def add(input_dim, indices_dim, slices_dim, size, kind, blocked):
        b.factor([input_dim] * n + [indices_dim] + [slices_dim] * n, [input_dim] * n, size, kind,
                 blocked)

    kind = REDUCTION if combiner in _REDUCERS else REPLICATION
    _gather_scatter_factors(
        add, True, inst.operands[0].shape, inst.operands[n + 1].shape, inst.operands[n].shape,
        inst.attrs["index_vector_dim"], attr_ints(inst, "update_window_dims"),
        attr_ints(inst, "inserted_window_dims", ()), attr_ints(inst, "input_batching_dims", ()),
        attr_ints(inst, "scatter_indices_batching_dims", ()), kind)
    return b.build()


def _combiner(inst, module) -> str | None:
    """The opcode of a computation whose root combines its two parameters, else None."""
    comp = module.computation(inst.attrs["to_apply"].name)
    root = comp.root
    if root.opcode == "tuple" or len(root.operands) != 2 or \
            any(o.opcode != "parameter" for o in root.operands):
        return None
    return root.opcode


def _pad(inst):
    return _mismatch_blocked(inst, inst.operands[0].shape.dims, inst.shape.dims, PERMUTATION,
                             blocked=False)


def _reduce(inst):
    n = len(inst.operands) // 2
    dims = attr_ints(inst, "dimensions")
    shape = inst.operands[0].shape
    b = RuleBuilder.of(inst)
    out = 0
    for d, size in enumerate(shape.dims):
        operand_dims = [d] * n + [None] * n
        if d in dims:
            b.factor(operand_dims, [None] * n, size, REDUCTION)
        else:
            b.factor(operand_dims, [out] * n, size)
            out += 1
    return b.build()


def _pass_through_window(window, dim) -> bool:
    w = window.dims[dim]
    return w.size == 1 and w.stride == 1 and w.padding_low == 0 and w.padding_high == 0


def _reduce_window(inst):
    window = inst.attrs["window"]
    result = _leaves(inst.shape)[0]
    return RuleBuilder.of(inst).pointwise(
        result.dims, lambda d: PASS if _pass_through_window(window, d) else PERMUTATION).build()


def _reshape(inst):
    in_dims, out_dims = inst.operands[0].shape.dims, inst.shape.dims
    if 0 in in_dims:
        return None
    b = RuleBuilder.of(inst)
    i = o = 0
    dims_in = dims_out = factors_in = factors_out = 1
    while i < len(in_dims) or o < len(out_dims):
        if i < len(in_dims) and in_dims[i] == 1:
            b.factor([i], [None], 1)
            i += 1
            continue
        if o < len(out_dims) and out_dims[o] == 1:
            b.factor([None], [o], 1)
            o += 1
            continue
        if i < len(in_dims) and dims_in == factors_in:
            dims_in *= in_dims[i]
        if o < len(out_dims) and dims_out == factors_out:
            dims_out *= out_dims[o]
        next_in, next_out = dims_in // factors_in, dims_out // factors_out
        gcd = _gcd(next_in, next_out)

        def diverged(nxt, smaller, larger):
            if larger % smaller == 0 and nxt % (larger // smaller) == 0:
                return larger // smaller
            return nxt // gcd if nxt > gcd else nxt

        if factors_in == factors_out:
            if gcd > 1:
                b.factor([i], [o], gcd)
                factors_in *= gcd
                factors_out *= gcd
            else:
                b.factor([i], [None], next_in)
                factors_in *= next_in
                b.factor([None], [o], next_out)
                factors_out *= next_out
        elif factors_in < factors_out:
            size = diverged(next_in, factors_in, factors_out)
            b.factor([i], [None], size)
            factors_in *= size
        else:
            size = diverged(next_out, factors_out, factors_in)
            b.factor([None], [o], size)
            factors_out *= size
        if i < len(in_dims) and dims_in == factors_in:
            i += 1
        if o < len(out_dims) and dims_out == factors_out:
            o += 1
    return b.build()


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _reverse(inst):
    dims = attr_ints(inst, "dimensions")
    return RuleBuilder.of(inst).pointwise(
        inst.shape.dims, lambda d: PERMUTATION if d in dims else PASS).build()


def _rng_bit_generator(inst):
    state, output = _leaves(inst.shape)
    b = RuleBuilder.of(inst)
    for d, size in enumerate(state.dims):
        b.factor([d], [d, None], size, REPLICATION, blocked=True)
    for d, size in enumerate(output.dims):
        b.factor([None], [None, d], size)
    return b.build()


def _select_and_scatter(inst):
    window = inst.attrs["window"]
    b = RuleBuilder.of(inst)
    source = inst.operands[1].shape
    for d, size in enumerate(inst.shape.dims):
        if _pass_through_window(window, d):
            b.factor_everywhere(d, size)
            continue
        b.factor([None, d, None], [None], source.dims[d], REPLICATION)
        b.factor([d, None, None], [d], size, PERMUTATION)
    return b.build()


def _slice(inst):
    return _mismatch_blocked(inst, inst.operands[0].shape.dims, inst.shape.dims, PERMUTATION,
                             blocked=False)


def _sort(inst):
    dim = inst.attrs["dimensions"][0]
    shape = inst.operands[0].shape
    blocked = all(d == dim or s == 1 for d, s in enumerate(shape.dims))
    b = RuleBuilder.of(inst)
    for d, size in enumerate(shape.dims):
        if d == dim:
            b.factor_everywhere(d, size, REPLICATION, blocked)
        else:
            b.factor_everywhere(d, size)
    return b.build()


def _transpose(inst):
    operand = inst.operands[0].shape
    b = RuleBuilder.of(inst)
    for out_dim, in_dim in enumerate(attr_ints(inst, "dimensions")):
        b.factor([in_dim], [out_dim], operand.dims[in_dim])
    return b.build()


def _triangular_solve(inst):
    a, bshape = inst.operands[0].shape, inst.operands[1].shape
    b = RuleBuilder.of(inst).pointwise(a.dims[:-2])
    d1, d2 = a.rank - 2, a.rank - 1
    transposed = str(inst.attrs.get("transpose_a", "NO_TRANSPOSE")) in ("TRANSPOSE", "ADJOINT")
    if inst.attrs.get("left_side") is True:
        nc, c = (d2, d1) if transposed else (d1, d2)
        b.factor([nc, d1], [None], a.dims[nc], REPLICATION)
        b.factor([None, d2], [d2], bshape.dims[d2], REPLICATION)
        b.factor([c, None], [d1], a.dims[c], REPLICATION)
    else:
        nc, c = (d1, d2) if transposed else (d2, d1)
        b.factor([None, d1], [d1], bshape.dims[d1], REPLICATION)
        b.factor([nc, d2], [None], a.dims[nc], REPLICATION)
        b.factor([c, None], [d2], a.dims[c], REPLICATION)
    return b.build()


def _topk(inst):
    return _mismatch_blocked(inst, inst.operands[0].shape.dims, _leaves(inst.shape)[0].dims)


RULES: dict[str, Callable[[Instruction], OpShardingRule | None]] = {
    **{opcode: _pointwise for opcode in _POINTWISE},
    "clamp": _clamp,
    "all-gather": lambda inst: _all_gather_like(inst, "dimensions"),
    "reduce-scatter": lambda inst: _all_gather_like(inst, "dimensions"),
    "all-to-all": _all_to_all,
    "bitcast-convert": _bitcast_convert,
    "broadcast": _broadcast,
    "cholesky": _cholesky,
    "concatenate": _concatenate,
    "convolution": _convolution,
    "custom-call": _custom_call,
    "dot": _dot,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
    "fft": _fft,
    "gather": _gather,
    "pad": _pad,
    "reduce": _reduce,
    "reduce-window": _reduce_window,
    "reshape": _reshape,
    "reverse": _reverse,
    "rng-bit-generator": _rng_bit_generator,
    "select-and-scatter": _select_and_scatter,
    "slice": _slice,
    "sort": _sort,
    "topk": _topk,
    "transpose": _transpose,
    "triangular-solve": _triangular_solve,
}


def rule_of(inst: Instruction, module) -> OpShardingRule | None:
    """The instruction's rule: its `xla.sdy.sharding_rule` if it has one, else the registry's
    (None when the op has no rule and so does not propagate)."""
    custom = frontend(inst).get(SHARDING_RULE)
    if custom is not None:
        return custom
    if inst.opcode == "scatter":
        return _scatter(inst, _combiner(inst, module))
    build = RULES.get(inst.opcode)
    return None if build is None else build(inst)
