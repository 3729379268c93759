"""Bytes per call read from the program MLX runs (`session.program.ProgramBytes`), checked against hand counts."""

import numpy as np

from rlxviz import session
from rlxviz.ir import Builder
from rlxviz.models import random_weights
from rlxviz.passes import run_passes
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.session.program import MODELLED_EXTRA, mlx_primitives, program_bytes_of, tape_bytes

F = 4  # bytes per float32
MLX_ONLY = LoweringOptions(kernels=False)  # MLX's own lowering (no rlxviz kernels): addmm, compiled GELU


def arr(i, *shape):
    return (i, list(shape), "float32", F * int(np.prod(shape, dtype=np.int64)))


def test_views_cost_the_storage_under_them_and_an_input_is_read_once():
    records = [
        ("Broadcast", [arr("b", 4)], [arr("bb", 2, 3, 4)]),  # a bias read as [2, 3, 4]: 4 elements under it
        ("Add", [arr("x", 2, 3, 4), arr("bb", 2, 3, 4)], [arr("y", 2, 3, 4)]),
        ("Multiply", [arr("y", 2, 3, 4), arr("y", 2, 3, 4)], [arr("z", 2, 3, 4)]),  # y twice: read once
        ("Slice", [arr("z", 2, 3, 4)], [arr("s", 2, 1, 4)]),  # a slice costs the slice
        ("Exp", [arr("s", 2, 1, 4)], [arr("e", 2, 1, 4)]),
        ("AddMM", [arr("a", 3, 5), arr("w", 5, 4), arr("b", 4)], [arr("o", 3, 4)]),
        ("Gather", [arr("table", 1000, 8), arr("ids", 1, 3)], [arr("rows", 1, 3, 1, 8)]),  # reads 3 rows of 1000
    ]
    moved = tape_bytes(records, "cpu")
    assert [k.name for k in moved.kernels] == ["Add", "Multiply", "Exp", "AddMM", "Gather"]  # views are not kernels
    assert [(k.read, k.written) for k in moved.kernels] == [
        ((24 + 4) * F, 24 * F), (24 * F, 24 * F), (8 * F, 8 * F), ((15 + 20 + 4) * F, 12 * F), ((24 + 3) * F, 24 * F)]
    assert moved.modelled == MODELLED_EXTRA[("cpu", "AddMM")] * 12 * F  # CPU AddMM's bias pre-fill, a model
    assert tape_bytes(records, "gpu").modelled == 0
    assert moved.total == moved.read + moved.written + moved.modelled


def linear_relu():
    b = Builder("linear_relu")
    x = b.input("x", (2, 8, 16))
    b.output(b.relu(b.linear(x, b.param("w", (16, 32)), b.param("b", (32,)))))
    g = b.build()
    return g, {"x": np.ones((2, 8, 16), np.float32)}, random_weights(g, seed=0)


def test_bytes_of_a_small_graph_match_a_hand_count():
    g, feeds, weights = linear_relu()
    p = mlx_primitives(g, feeds, weights, executor=MlxExecutor(MLX_ONLY))
    x, w, b, h = 2 * 8 * 16 * F, 16 * 32 * F, 32 * F, 2 * 8 * 32 * F
    # Matmul reads x and w, writes h; Add reads h and the [32] bias under its Broadcast, writes h;
    # relu's Maximum reads h and the scalar 0 under its Broadcast, writes h
    assert [(k.name, k.read, k.written) for k in p.bytes.kernels] == [
        ("Matmul", x + w, h), ("Add", h + b, h), ("Maximum", h + F, h)]
    assert p.bytes.total == x + w + b + F + 5 * h and p.bytes.modelled == 0
    assert len(p.bytes.kernels) == p.kernels  # one record per non-view primitive of the same program


def test_the_export_reading_agrees_where_nothing_is_compiled():
    import mlx.core as mx

    from rlxviz.session.program import _export_records

    g, feeds, weights = linear_relu()
    ex = MlxExecutor(MLX_ONLY)
    prog, args = ex.bind(g, feeds, weights)
    mx.eval(args)
    tape = program_bytes_of(prog.fn, args, "cpu")
    export = tape_bytes(_export_records(prog.fn, args), "cpu", exact_compiled=False)
    assert tape.exact_compiled and (export.read, export.written) == (tape.read, tape.written)


def ffn():
    b = Builder("ffn")
    x = b.input("x", (2, 8, 16))
    h = b.gelu(b.linear(x, b.param("w1", (16, 32)), b.param("b1", (32,))))
    y = b.linear(h, b.param("w2", (32, 16)), b.param("b2", (16,)))
    b.output(b.layer_norm(b.add(y, x), b.param("g", (16,)), b.param("beta", (16,))))
    g = b.build()
    return g, {"x": np.ones((2, 8, 16), np.float32)}, random_weights(g, seed=0)


def test_cpu_addmm_moves_what_matmul_and_add_move():
    g, feeds, weights = ffn()
    ex = MlxExecutor(MLX_ONLY)
    versions = run_passes(g, ["fuse_matmul_bias_act"]).versions()
    before, after = (mlx_primitives(v, feeds, weights, executor=ex) for _, v in versions)
    assert "AddMM" not in before.counts() and after.counts()["AddMM"] == 2
    # the graph shows AddMM saving one write and one read of each linear's output ...
    outs = (2 * 8 * 32 + 2 * 8 * 16) * F
    assert before.bytes.from_graph - after.bytes.from_graph == 2 * outs
    # ... which its CPU implementation spends again (bias pre-fill, BLAS beta = 1): 0 B saved, as measured
    assert after.bytes.modelled == 2 * outs and after.bytes.total == before.bytes.total


def test_rlxviz_kernels_remove_the_intermediates_mlx_would_move():
    g, feeds, weights = ffn()
    rows = session.version_primitives(run_passes(g, ["fuse_matmul_bias_act", "fuse_residual_ln"]), feeds, weights)
    totals = [r.program.bytes.total for r in rows]
    assert all(r.program.bytes.source.startswith("MLX's lazy graph") for r in rows)
    assert totals[0] > totals[1] > totals[2]  # bias+GELU in one pass, then residual+norm in one pass
    ln = rows[2].program.bytes.by_primitive()
    assert "RlxvizResidualLayerNorm" in ln and "Sum" not in ln
    assert "bytes (MLX graph)" in session.format_primitives(rows)


def test_roofline_reads_version_bytes_from_mlx_when_given_inputs():
    g, feeds, weights = ffn()
    trace = run_passes(g, ["fuse_matmul_bias_act", "fuse_residual_ln"])
    model = session.roofline(trace, "cpu")
    read = session.roofline(trace, "cpu", feeds, weights)
    prims = session.version_primitives(trace, feeds, weights)
    assert [r.bytes for r in read] == [p.program.bytes.total for p in prims]
    assert {r.bytes_source for r in read} == {"MLX's graph"} and {r.bytes_source for r in model} == {"model"}
    assert [r.flops for r in read] == [r.flops for r in model]  # FLOPs come from the graph either way


def test_a_compiled_function_called_twice_is_two_kernels():
    """mx.compile reuses one Primitive object per call of a compiled function: the walk must not merge the calls."""
    import mlx.core as mx

    f = mx.compile(lambda x: mx.exp(x) * 2 + 1)
    a = mx.ones((4, 8))
    mx.eval(a)
    moved = program_bytes_of(lambda x: [f(f(x))], [a], "cpu")
    assert [k.name.startswith("Compiled") for k in moved.kernels] == [True, True]
    assert moved.read == 2 * 4 * 8 * F + 2 * 2 * F and moved.written == 2 * 4 * 8 * F  # + the two scalar constants
