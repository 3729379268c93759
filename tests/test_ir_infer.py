"""Shape and dtype inference: results for every op family and the error for each kind of misuse."""

import pytest

from rlxviz.ir import DType, Op, ShapeError, TensorType, infer
from rlxviz.ir.dtype import promote
from rlxviz.ir.emitter import normalize_attrs
from rlxviz.ir.infer import RULES, broadcast
from rlxviz.ir.ops import LEAF, SPECS


def T(*shape: int, dtype: DType = DType.f32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def run(op: Op, attrs: dict, *xs: TensorType) -> TensorType:
    return infer(op, normalize_attrs(op, attrs), xs)


def test_every_non_leaf_op_has_a_rule_and_a_spec():
    assert set(SPECS) == set(Op)
    assert set(RULES) == set(Op) - LEAF
    with pytest.raises(ShapeError, match=r"\[input\] has no inference rule"):
        infer(Op.INPUT, {"name": "x"}, [])


ATTN = {"num_heads": 2, "head_dim": 4}
FAB = {"num_heads": 2, "head_dim": 2}
B, S, H = 2, 3, 4
FTL_OK = (T(B, S, H), T(H, 3 * H), T(3 * H), T(H, H), T(H), T(H), T(H), T(H, 8), T(8), T(8, H), T(H), T(H), T(H),
          T(B, S))
FTL_ATTRS = {"num_heads": 2, "head_dim": 2, "intermediate_size": 8, "eps1": 1e-12, "eps2": 1e-12,
             "activation": "gelu"}


@pytest.mark.parametrize("op, attrs, operands, out", [
    (Op.MATMUL, {}, (T(2, 3, 4), T(4, 5)), T(2, 3, 5)),
    (Op.MATMUL, {}, (T(2, 1, 3, 4), T(5, 4, 6)), T(2, 5, 3, 6)),
    (Op.ADD, {}, (T(2, 1, 4), T(3, 1)), T(2, 3, 4)),
    (Op.ADD, {}, (T(2, 3), T(dtype=DType.f16)), T(2, 3)),
    (Op.MUL, {}, (T(2, dtype=DType.f16), T(2, dtype=DType.bf16)), T(2)),
    (Op.ADD, {}, (T(2, dtype=DType.i64), T(2)), T(2, dtype=DType.f64)),
    (Op.LT, {}, (T(2, 3), T(3)), T(2, 3, dtype=DType.bool)),
    (Op.WHERE, {}, (T(2, 1, dtype=DType.bool), T(3), T()), T(2, 3)),
    (Op.CAST, {"dtype": "f16"}, (T(2, 3),), T(2, 3, dtype=DType.f16)),
    (Op.GELU_TANH, {}, (T(2, 3),), T(2, 3)),
    (Op.REDUCE_SUM, {"axes": (0, -1)}, (T(2, 3, 4),), T(3)),
    (Op.REDUCE_MAX, {"axes": (1,), "keepdims": True}, (T(2, 3, 4),), T(2, 1, 4)),
    (Op.SOFTMAX, {"axis": 0}, (T(2, 3),), T(2, 3)),
    (Op.LAYER_NORM, {"eps": 1e-5}, (T(2, 3), T(3), T(3)), T(2, 3)),
    (Op.RESHAPE, {"shape": (-1, 2)}, (T(2, 3, 4),), T(12, 2)),
    (Op.RESHAPE, {"shape": ()}, (T(1, 1),), T()),
    (Op.TRANSPOSE, {"perm": (2, 0, 1)}, (T(2, 3, 4),), T(4, 2, 3)),
    (Op.NARROW, {"axis": -1, "start": 1, "length": 3}, (T(2, 4),), T(2, 3)),
    (Op.NARROW, {"axis": 0, "start": 2, "length": 0}, (T(2, 4),), T(0, 4)),
    (Op.CONCAT, {"axis": 1}, (T(2, 3), T(2, 1), T(2, 2)), T(2, 6)),
    (Op.EXPAND, {"shape": (2, 3, 4)}, (T(3, 1),), T(2, 3, 4)),
    (Op.GATHER, {}, (T(10, 4), T(2, 3, dtype=DType.i64)), T(2, 3, 4)),
    (Op.ATTENTION, {**ATTN, "mask": "keep"}, (T(2, 3, 8), T(2, 5, 8), T(2, 5, 8), T(2, 5)), T(2, 3, 8)),
    (Op.ATTENTION, {**ATTN, "mask": "causal"}, (T(2, 3, 8), T(2, 5, 8), T(2, 5, 8)), T(2, 3, 8)),
    (Op.ATTENTION, {**ATTN, "mask": "additive"}, (T(2, 3, 8), T(2, 5, 8), T(2, 5, 8), T(1, 1, 3, 5)), T(2, 3, 8)),
    (Op.ROPE, {"head_dim": 4, "n_rot": 2}, (T(2, 3, 8), T(16, 1), T(16, 2)), T(2, 3, 8)),
    (Op.FUSED_MATMUL_BIAS_ACT, {"activation": "silu"}, (T(2, 3, 4), T(4, 5), T(5)), T(2, 3, 5)),
    (Op.FUSED_MATMUL_BIAS_ACT, {}, (T(2, 3, 4), T(4, 5), T()), T(2, 3, 5)),
    (Op.FUSED_RESIDUAL_LN, {"eps": 1e-5}, (T(2, 3), T(2, 3), T(3), T(3)), T(2, 3)),
    (Op.FUSED_RESIDUAL_RMS_NORM, {"eps": 1e-5, "has_bias": True}, (T(2, 3), T(2, 3), T(3), T(3), T(3)), T(2, 3)),
    (Op.FUSED_SWIGLU, {}, (T(2, 3, 8),), T(2, 3, 4)),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(H, 12), T(H, 6), T(B, S), T(12), T(6)), T(B, S, 6)),
    (Op.FUSED_ATTENTION_BLOCK, {**FAB, "has_bias": False, "has_rope": True},
     (T(B, S, H), T(H, 12), T(H, H), T(B, S), T(8, 1), T(8, 1)), T(B, S, H)),
    (Op.FUSED_TRANSFORMER_LAYER, FTL_ATTRS, FTL_OK, T(B, S, H)),
    (Op.ELEMENTWISE_REGION, {"chain": (("mul", "i0", "i1"), ("cast:f16", "s0"), ("gelu", "s1"))},
     (T(2, 3), T(3)), T(2, 3, dtype=DType.f16)),
])
def test_inferred_types(op, attrs, operands, out):
    assert run(op, attrs, *operands) == out


def test_promotion_is_symmetric():
    for a in DType:
        for b in DType:
            assert promote(a, b) == promote(b, a)


def test_broadcast_rules():
    assert broadcast((2, 1, 4), (3, 1)) == (2, 3, 4)
    assert broadcast((0, 1), (1, 5)) == (0, 5)
    with pytest.raises(ShapeError, match=r"shapes \[2, 3\] and \[4\] do not broadcast"):
        broadcast((2, 3), (4,))


@pytest.mark.parametrize("op, attrs, operands, pattern", [
    # linear algebra
    (Op.MATMUL, {}, (T(2, 3), T(4, 5)), r"\[matmul\] contraction mismatch: f32\[2, 3\] @ f32\[4, 5\] \(3 != 4\)"),
    (Op.MATMUL, {}, (T(3), T(3, 2)), r"operands need rank >= 2"),
    (Op.MATMUL, {}, (T(2, 3, 4), T(5, 4, 2)), r"\[matmul\] shapes \[2\] and \[5\] do not broadcast"),
    # elementwise
    (Op.ADD, {}, (T(2, 3), T(2,)), r"\[add\] shapes \[2, 3\] and \[2\] do not broadcast"),
    (Op.GE, {}, (T(2, 3), T(4, 1, 2)), r"\[ge\] shapes .* do not broadcast"),
    (Op.EXP, {}, (T(2, dtype=DType.i32),), r"\[exp\] needs a float operand, got i32\[2\]"),
    (Op.WHERE, {}, (T(2), T(2), T(2)), r"condition must be bool"),
    (Op.CAST, {"dtype": "f8"}, (T(2),), r"\[cast\] unknown dtype 'f8'"),
    # reductions
    (Op.REDUCE_SUM, {"axes": (3,)}, (T(2, 3),), r"\[reduce_sum\] axis 3 out of range for rank 2"),
    (Op.REDUCE_MEAN, {"axes": (1, -1)}, (T(2, 3),), r"repeated axis in \[1, -1\]"),
    (Op.SOFTMAX, {"axis": -3}, (T(2, 3),), r"axis -3 out of range"),
    (Op.SOFTMAX, {}, (T(2, dtype=DType.bool),), r"needs a float operand"),
    # normalisation
    (Op.LAYER_NORM, {"eps": 1e-5}, (T(2, 3), T(2), T(3)), r"gamma must be \[3\] .* got f32\[2\]"),
    (Op.RMS_NORM, {"eps": 1e-5}, (T(2, 3), T(3), T(1, 3)), r"beta must be \[3\]"),
    (Op.LAYER_NORM, {"eps": 1e-5, "axis": 0}, (T(2, 3), T(3), T(3)), r"only the last axis"),
    (Op.LAYER_NORM, {"eps": 1e-5}, (T(dtype=DType.f32), T(), T()), r"axis -1 out of range for rank 0"),
    # movement
    (Op.RESHAPE, {"shape": (5, -1)}, (T(2, 3),), r"cannot reshape f32\[2, 3\] to \[5, -1\]"),
    (Op.RESHAPE, {"shape": (-1, -1)}, (T(2, 3),), r"at most one -1"),
    (Op.RESHAPE, {"shape": (7,)}, (T(2, 3),), r"\(6 elements\) to \[7\]"),
    (Op.RESHAPE, {"shape": (-2, -3)}, (T(2, 3),), r"cannot reshape"),
    (Op.RESHAPE, {"shape": ("a",)}, (T(2, 3),), r"\[reshape\] bad operands or attributes"),
    (Op.TRANSPOSE, {"perm": (0, 0)}, (T(2, 3),), r"perm \[0, 0\] is not a permutation"),
    (Op.TRANSPOSE, {"perm": (1, 0, 2)}, (T(2, 3),), r"not a permutation"),
    (Op.NARROW, {"axis": 1, "start": 2, "length": 2}, (T(2, 3),), r"slice \[2, 4\) out of bounds for axis 1"),
    (Op.NARROW, {"axis": 1, "start": -1, "length": 1}, (T(2, 3),), r"out of bounds"),
    (Op.NARROW, {"axis": 2, "start": 0, "length": 1}, (T(2, 3),), r"axis 2 out of range for rank 2"),
    (Op.CONCAT, {"axis": 0}, (T(2, 3), T(2, 4)), r"shapes differ outside axis 0"),
    (Op.CONCAT, {"axis": 0}, (T(2, 3), T(3)), r"shapes differ outside axis 0"),
    (Op.CONCAT, {"axis": 0}, (T(2, 3), T(2, 3, dtype=DType.f16)), r"dtype mismatch"),
    (Op.EXPAND, {"shape": (2, 2)}, (T(3),), r"do not broadcast"),
    (Op.EXPAND, {"shape": (1,)}, (T(3),), r"cannot expand f32\[3\] to \[1\]"),
    (Op.GATHER, {}, (T(10, 4), T(2, 3)), r"indices must be integers"),
    (Op.GATHER, {"axis": 1}, (T(10, 4), T(2, dtype=DType.i64)), r"only axis 0"),
    (Op.GATHER, {}, (T(), T(2, dtype=DType.i64)), r"table must have rank >= 1"),
    # attention
    (Op.ATTENTION, ATTN, (T(2, 3, 6), T(2, 3, 8), T(2, 3, 8)), r"q last dim 6 != num_heads\*head_dim = 2\*4"),
    (Op.ATTENTION, ATTN, (T(6, 8), T(6, 8), T(6, 8)), r"q must be packed \[batch, seq, heads\*head_dim\]"),
    (Op.ATTENTION, ATTN, (T(2, 3, 8), T(2, 4, 8), T(2, 5, 8)), r"k f32\[2, 4, 8\] and v f32\[2, 5, 8\] differ"),
    (Op.ATTENTION, ATTN, (T(1, 3, 8), T(2, 3, 8), T(2, 3, 8)), r"batch of q .* and k .* differ"),
    (Op.ATTENTION, ATTN, (T(2, 3, 8), T(2, 3, 8), T(2, 3, 8, dtype=DType.f16)), r"q, k, v dtypes differ"),
    (Op.ATTENTION, {**ATTN, "mask": "keep"}, (T(2, 3, 8),) * 3, r"mask kind 'keep' takes 4 operands, got 3"),
    (Op.ATTENTION, {**ATTN, "mask": "causal"}, (T(2, 3, 8),) * 3 + (T(2, 3),), r"'causal' takes 3 operands, got 4"),
    (Op.ATTENTION, {**ATTN, "mask": "keep"}, (T(2, 3, 8), T(2, 5, 8), T(2, 5, 8), T(2, 3)),
     r"keep mask must be \[batch, kv_len\] = \[2, 5\], got f32\[2, 3\]"),
    (Op.ATTENTION, {**ATTN, "mask": "keep"}, (T(2, 3, 8), T(2, 5, 8), T(2, 5, 8), T(2, 1, 5)), r"keep mask must be"),
    (Op.ATTENTION, {**ATTN, "mask": "additive"}, (T(2, 3, 8), T(2, 5, 8), T(2, 5, 8), T(2, 3, 3)),
     r"additive mask f32\[2, 3, 3\] does not broadcast to \[2, 2, 3, 5\]"),
    (Op.ATTENTION, {**ATTN, "mask": "additive"}, (T(2, 3, 8), T(2, 5, 8), T(2, 5, 8), T(1, 1, 1, 1, 5)),
     r"does not broadcast"),
    (Op.ATTENTION, {"num_heads": 0, "head_dim": 4}, (T(2, 3, 0),) * 3, r"must be positive"),
    (Op.ATTENTION, {**ATTN, "mask": "weird"}, (T(2, 3, 8),) * 3, r"unknown mask kind 'weird'"),
    (Op.ROPE, {"head_dim": 4, "n_rot": 3}, (T(2, 3, 8), T(16, 2), T(16, 2)), r"n_rot 3 must be even"),
    (Op.ROPE, {"head_dim": 4, "n_rot": 8}, (T(2, 3, 8), T(16, 4), T(16, 4)), r"n_rot 8 must be even and <= head_dim"),
    (Op.ROPE, {"head_dim": 3, "n_rot": 2}, (T(2, 3, 8), T(16, 1), T(16, 1)), r"x must be packed .*heads\*3\]"),
    (Op.ROPE, {"head_dim": 4, "n_rot": 4}, (T(2, 5, 8), T(4, 2), T(4, 2)), r"cos must be \[max_pos >= 5, >= 2\]"),
    (Op.ROPE, {"head_dim": 4, "n_rot": 4}, (T(2, 3, 8), T(4, 2), T(4, 1)), r"sin must be"),
    (Op.ROPE, {"head_dim": 0, "n_rot": 0}, (T(2, 3, 8), T(4, 2), T(4, 1)), r"head_dim 0 must be positive"),
    # fused: matmul + bias + act
    (Op.FUSED_MATMUL_BIAS_ACT, {}, (T(2, 3), T(4, 5), T(5)), r"\[FusedMatMulBiasAct\] contraction mismatch"),
    (Op.FUSED_MATMUL_BIAS_ACT, {}, (T(2, 4), T(4, 5), T(4)), r"bias must be rank <= 1 with length 5, got f32\[4\]"),
    (Op.FUSED_MATMUL_BIAS_ACT, {}, (T(2, 4), T(4, 5), T(2, 5)), r"bias must be rank <= 1"),
    (Op.FUSED_MATMUL_BIAS_ACT, {"activation": "exp"}, (T(2, 4), T(4, 5), T(5)), r"unknown activation 'exp'"),
    (Op.FUSED_MATMUL_BIAS_ACT, {"activation": "nope"}, (T(2, 4), T(4, 5), T(5)), r"unknown activation 'nope'"),
    # fused: residual norms
    (Op.FUSED_RESIDUAL_LN, {"eps": 1e-5}, (T(2, 3), T(2, 3), T(3), T(3), T(3)), r"has_bias=False takes 4 operands"),
    (Op.FUSED_RESIDUAL_LN, {"eps": 1e-5, "has_bias": True}, (T(2, 3), T(2, 3), T(3), T(3)),
     r"has_bias=True takes 5 operands"),
    (Op.FUSED_RESIDUAL_LN, {"eps": 1e-5}, (T(2, 3), T(1, 3), T(3), T(3)), r"x f32\[2, 3\] and residual f32\[1, 3\]"),
    (Op.FUSED_RESIDUAL_RMS_NORM, {"eps": 1e-5, "has_bias": True}, (T(2, 3), T(2, 3), T(2), T(3), T(3)),
     r"residual norm: bias must be \[3\]"),
    (Op.FUSED_SWIGLU, {}, (T(2, 3),), r"packed input needs an even last dim"),
    (Op.FUSED_SWIGLU, {}, (T(),), r"packed input needs an even last dim"),
    # fused: attention block
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(S, H), T(H, 12), T(H, 6), T(B, S), T(12), T(6)),
     r"hidden must be \[batch, seq, hidden\], got f32\[3, 4\]"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(), T(H, 12), T(H, 6), T(B, S), T(12), T(6)), r"hidden must be"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(H, 12), T(H, 6), T(B, S)), r"takes 6 operands"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(H, 9), T(H, 6), T(B, S), T(9), T(6)),
     r"qkv width 9 != 3\*num_heads\*head_dim = 12"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(5, 12), T(H, 6), T(B, S), T(12), T(6)), r"contraction mismatch"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(H, 12), T(H, 6), T(B, S), T(11), T(6)),
     r"qkv bias must be \[12\]"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(H, 12), T(5, 6), T(B, S), T(12), T(6)), r"contraction mismatch"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(H, 12), T(H, 6), T(B, S), T(12), T(5)), r"out bias must be \[6\]"),
    (Op.FUSED_ATTENTION_BLOCK, FAB, (T(B, S, H), T(H, 12), T(H, 6), T(B, S + 1), T(12), T(6)),
     r"mask must be \[batch, seq\] = \[2, 3\]"),
    (Op.FUSED_ATTENTION_BLOCK, {**FAB, "has_rope": True}, (T(B, S, H), T(H, 12), T(H, 6), T(B, S), T(12), T(6),
                                                           T(2, 1), T(8, 1)), r"cos must be \[max_pos >= 3"),
    (Op.FUSED_ATTENTION_BLOCK, {"num_heads": 0, "head_dim": 2}, (T(B, S, H), T(H, 12), T(H, 6), T(B, S), T(12), T(6)),
     r"must be positive"),
    # fused: transformer layer
    (Op.FUSED_TRANSFORMER_LAYER, {**FTL_ATTRS, "has_bias": False}, FTL_OK, r"only has_bias=True"),
    (Op.FUSED_TRANSFORMER_LAYER, {**FTL_ATTRS, "intermediate_size": 16}, FTL_OK, r"has no intermediate dim 16"),
    (Op.FUSED_TRANSFORMER_LAYER, {**FTL_ATTRS, "activation": "log"}, FTL_OK, r"unknown activation 'log'"),
    (Op.FUSED_TRANSFORMER_LAYER, FTL_ATTRS, FTL_OK[:3] + (T(H, 6), T(6)) + FTL_OK[5:],
     r"attention output f32\[2, 3, 6\] != hidden f32\[2, 3, 4\]"),
    (Op.FUSED_TRANSFORMER_LAYER, FTL_ATTRS, FTL_OK[:5] + (T(3),) + FTL_OK[6:], r"ln1: gamma must be \[4\]"),
    (Op.FUSED_TRANSFORMER_LAYER, FTL_ATTRS, FTL_OK[:9] + (T(8, 5), T(5)) + FTL_OK[11:],
     r"ffn output f32\[2, 3, 5\] != hidden"),
    (Op.FUSED_TRANSFORMER_LAYER, FTL_ATTRS, FTL_OK[:12] + (T(5),) + FTL_OK[13:], r"ln2: beta must be \[4\]"),
    (Op.FUSED_TRANSFORMER_LAYER, FTL_ATTRS, FTL_OK[:13] + (T(B, S + 1),), r"mask must be \[batch, seq\]"),
    # elementwise region
    (Op.ELEMENTWISE_REGION, {"chain": (("matmul", "i0", "i1"),)}, (T(2, 2), T(2, 2)), r"matmul is not elementwise"),
    (Op.ELEMENTWISE_REGION, {"chain": (("frob", "i0"),)}, (T(2),), r"unknown chain op 'frob'"),
    (Op.ELEMENTWISE_REGION, {"chain": (("add", "i0", "i2"),)}, (T(2), T(2)), r"step 0: bad operand 'i2'"),
    (Op.ELEMENTWISE_REGION, {"chain": (("add", "i0", "s0"),)}, (T(2), T(2)), r"step 0: bad operand 's0'"),
    (Op.ELEMENTWISE_REGION, {"chain": (("add", "i0", "x1"),)}, (T(2), T(2)), r"bad operand 'x1'"),
    (Op.ELEMENTWISE_REGION, {"chain": (("add", "i0", "i1"),)}, (T(2), T(3)), r"\[add\] shapes \[2\] and \[3\]"),
    (Op.ELEMENTWISE_REGION, {"chain": (("relu", "i0"),)}, (T(2), T(3, 1)),
     r"input i1 f32\[3, 1\] is larger than the result f32\[2\]"),
    (Op.ELEMENTWISE_REGION, {"chain": (("cast:f9", "i0"),)}, (T(2),), r"unknown dtype 'f9'"),
    (Op.ELEMENTWISE_REGION, {"chain": (("add", "i0"),)}, (T(2),), r"chain op add takes \(2,\) operand\(s\), got 1"),
    (Op.ELEMENTWISE_REGION, {"chain": ("add",)}, (T(2),), r"chain step must be a tuple of strings"),
    (Op.ELEMENTWISE_REGION, {"chain": ()}, (T(2),), r"empty chain"),
    # missing attributes
    (Op.NARROW, {"axis": 0, "start": 0}, (T(2),), r"\[narrow\] missing attribute 'length'"),
])
def test_shape_errors(op, attrs, operands, pattern):
    with pytest.raises(ShapeError, match=pattern) as e:
        run(op, attrs, *operands)
    assert str(e.value).startswith(f"[{op.value}] ")
