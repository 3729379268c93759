"""Core IR behaviour: builder, use-def, printer/parser round trip, verifier, rewriter."""

import numpy as np
import pytest

from rlxviz.ir import Builder, GraphError, IRSyntaxError, Op, Rewriter, ShapeError, format_graph, lint, parse_ir
from rlxviz.runtime import run_reference


def mlp():
    b = Builder("mlp")
    x = b.input("x", (2, 8, 16))
    with b.scope("fc"):
        mm = b.matmul(x, b.param("fc.weight", (16, 32)))
        add = b.add(mm, b.param("fc.bias", (32,)))
        act = b.gelu(add)
    b.output(act)
    return b.build(), (x, mm, add, act)


def test_use_def_counts_outputs_once_per_use():
    g, (x, mm, add, act) = mlp()
    assert [u.id for u in g.users(mm)] == [add]
    assert g.use_count(act) == 1 and g.is_output(act)
    assert g.use_count(x) == 1


def test_printer_round_trip_and_provenance():
    g, (_, mm, _, _) = mlp()
    text = format_graph(g)
    assert f"%{mm} = matmul(%0, %1) : f32[2, 8, 32] @fc" in text
    assert format_graph(parse_ir(text)) == text


def test_parse_error_has_line_and_column():
    g, _ = mlp()
    bad = format_graph(g).replace("gelu(", "geluu(")
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(bad)
    assert e.value.line == 7 and e.value.col == 8 and "unknown op 'geluu'" in str(e.value)


def test_shape_error_names_op_and_path():
    b = Builder()
    x = b.input("x", (2, 3))
    with b.scope("encoder.layer.0"), pytest.raises(ShapeError, match=r"\[matmul\].*encoder.layer.0"):
        b.matmul(x, b.param("w", (4, 5)))


def test_lint_catches_cycle():
    g, _ = mlp()
    text = format_graph(g).replace("matmul(%0, %1)", "matmul(%5, %1)")
    with pytest.raises(GraphError, match="cycle"):
        parse_ir(text)


def test_rewriter_fuses_and_keeps_numbers():
    g, (x, mm, add, act) = mlp()
    rw = Rewriter(g, "fuse_matmul_bias_act")
    w, bias = g[mm].inputs[1], g[add].inputs[1]
    new = rw.fuse(Op.FUSED_MATMUL_BIAS_ACT, (x, w, bias), {"activation": "gelu"}, absorbed=(mm, add, act))
    g2 = lint(rw.finish())
    assert g2.outputs == (new,) and g2[new].absorbed == (mm, add, act) and g2[new].path == "fc"
    assert new >= g.next_id
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 8, 16), dtype=np.float32)}
    weights = {"fc.weight": rng.standard_normal((16, 32), dtype=np.float32),
               "fc.bias": rng.standard_normal(32, dtype=np.float32)}
    np.testing.assert_allclose(run_reference(g2, feeds, weights)[0], run_reference(g, feeds, weights)[0],
                               rtol=1e-5, atol=1e-6)
