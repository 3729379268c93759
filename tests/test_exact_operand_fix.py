"""An operand that differs from what a fused op takes only by a broadcast (a scalar, `[1]` or `[1, N]` bias for `[N]`)
is a model fix that keeps the numbers, not an illegal fusion; the sibling comparison names operand type differences.

Variants of the handed `ir_scalar_bias_layer1.ir` (layer 1's fc2 bias is `f32[]`): the bias stored as `[1]`,
`[1, 64]` (exact fixes), `[8, 64]` (no exact fix: it adds a different number per row) and a scalar bias that is
also a graph output (no exact fix: the caller reads its shape)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import run

from rlxviz.ir import parse_ir
from rlxviz.ir.infer import TensorType
from rlxviz.passes.engine import same_for_readers
from rlxviz.passes.explain import operand_type_diff

DATA = Path(__file__).parent / "data" / "reliability"
SOURCE = DATA / "ir_scalar_bias_layer1.ir"
BIAS = 'bias"} : f32[] @encoder.layer.1.output.dense'


def variant(tmp_path: Path, shape: str, returned: bool = False) -> Path:
    """The handed file with layer 1's fc2 bias (node 65) of type `f32[shape]` (and returned too when `returned`)."""
    text = SOURCE.read_text()
    assert BIAS in text
    text = text.replace(BIAS, BIAS.replace("f32[]", f"f32[{shape}]"))
    if returned:
        assert "  return %71\n" in text
        text = text.replace("  return %71\n", "  return %71, %65\n")
    p = tmp_path / f"bias_{shape.replace(', ', 'x') or 'scalar'}{'_out' if returned else ''}.ir"
    p.write_text(text)
    return p


@pytest.mark.parametrize("shape", ["", "1"])
def test_scalar_or_unit_bias_is_a_model_fix_not_illegal(capsys, tmp_path, shape):
    path = SOURCE if not shape else variant(tmp_path, shape)
    code, out, err = run(capsys, "explain", path)
    assert code == 1 and not err, (out, err)
    assert f"guard fused_types (guard, not recognized): FusedTransformerLayer cannot replace the match: " \
           f"[FusedTransformerLayer] fc2 bias must be [64], got f32[{shape}]" in out
    assert "guard fused_types (guard, illegal)" not in out
    # the fix is printed only after its what-if fused and kept the numbers (session.advice)
    assert "fix: store encoder.layer.1.output.dense.bias (node 65, encoder.layer.1.output.dense) as f32[64]: " \
           "the same numbers" in out, out
    assert f"compiler fix: let FusedTransformerLayer broadcast a f32[{shape}] operand to f32[64]" in out
    assert "(same primitive structure)" not in out
    assert f"layer 1: add@output.dense operand 1 (encoder.layer.1.output.dense.bias) is f32[{shape}] where " \
           f"layer 0's is f32[64]" in out


def test_leading_one_bias_is_a_checked_model_fix(capsys, tmp_path):
    code, out, _ = run(capsys, "explain", variant(tmp_path, "1, 64"))
    assert code == 1
    assert "bias_rank [not recognized]" in out
    assert "-> store the bias as a vector [N] without its leading 1s (the same numbers" in out, out
    assert "is f32[1, 64] where layer 0's is f32[64]" in out


@pytest.mark.parametrize("shape, returned", [("8, 64", False), ("", True)])
def test_a_bias_no_broadcast_makes_exact_has_no_model_fix(capsys, tmp_path, shape, returned):
    """`[8, 64]` adds another number per row; a scalar bias that is also returned is read by the caller as `[]`:
    neither can be stored another way with the same numbers."""
    code, out, _ = run(capsys, "explain", variant(tmp_path, shape, returned))
    assert code == 1
    assert "store the bias" not in out and "as f32[64]: the same numbers" not in out, out
    if returned:
        assert "guard fused_types (guard, illegal)" in out
        assert "fix: none in the model: the fused op's operands must have the shapes and dtypes" in out
    else:
        assert "-> none in the model: FusedMatMulBiasAct adds a bias along the output width (64) only" in out


def test_same_for_readers_validity():
    g = parse_ir(SOURCE.read_text())
    assert same_for_readers(g, 65, TensorType((64,), g[65].dtype))  # add(matmul [1, 8, 64], bias): same result
    assert same_for_readers(g, 65, TensorType((8, 64), g[65].dtype))  # a scalar copied to [8, 64]: the same add
    assert not same_for_readers(g, 65, TensorType((2, 64), g[65].dtype))  # the add's type would change
    assert not same_for_readers(g, 64, TensorType((1, 256, 64), g[64].dtype))  # a matmul reader does not broadcast


def test_operand_type_diff_pairs_nodes_and_is_empty_for_equal_layers(tmp_path):
    g = parse_ir(SOURCE.read_text())
    assert operand_type_diff(g, 1, 0) == ["layer 1: add@output.dense operand 1 (encoder.layer.1.output.dense.bias) "
                                          "is f32[] where layer 0's is f32[64]"]
    assert operand_type_diff(g, 0, 0) == []
    g2 = parse_ir(variant(tmp_path, "1, 64").read_text())
    assert operand_type_diff(g2, 0, 1) == ["layer 0: add@output.dense operand 1 (encoder.layer.0.output.dense.bias) "
                                           "is f32[64] where layer 1's is f32[1, 64]"]
