"""Roofline numbers from the graph: FLOPs per op, bytes per op and per version, consistent with the traffic views."""

import pytest

from rlxviz import session
from rlxviz.ir import Builder
from rlxviz.passes import Pipeline, run_passes

B, S, H, N_FF = 2, 4, 8, 16


def ffn():
    b = Builder("ffn")
    x = b.input("x", (B, S, H))
    h = b.gelu(b.linear(x, b.param("w1", (H, N_FF)), b.param("b1", (N_FF,))))
    y = b.linear(h, b.param("w2", (N_FF, H)), b.param("b2", (H,)))
    b.output(b.layer_norm(b.add(y, x), b.param("g", (H,)), b.param("beta", (H,))))
    return b.build()


def test_op_costs_count_flops_and_bytes_from_shapes():
    costs = {c.node: c for c in session.op_costs(ffn())}
    by_op = [(c.op, c.flops, c.bytes) for c in costs.values()]
    f = 4  # bytes per f32
    assert by_op == [
        ("matmul", 2 * B * S * H * N_FF, (B * S * N_FF + B * S * H + H * N_FF) * f),
        ("add", B * S * N_FF, (2 * B * S * N_FF + N_FF) * f),
        ("gelu", 29 * B * S * N_FF, 2 * B * S * N_FF * f),  # erf 25 + 4 (not 1 per element)
        ("matmul", 2 * B * S * N_FF * H, (B * S * H + B * S * N_FF + N_FF * H) * f),
        ("add", B * S * H, (2 * B * S * H + H) * f),
        ("add", B * S * H, 3 * B * S * H * f),
        ("layer_norm", 8 * B * S * H, (2 * B * S * H + 2 * H) * f),
    ]
    assert all(c.intensity == c.flops / c.bytes for c in costs.values())


def test_static_weight_prep_is_not_per_call_traffic():
    b = Builder("prep")
    x = b.input("x", (2, 4))
    w = b.concat([b.param("wa", (4, 3)), b.param("wb", (4, 3))], axis=1)  # params only: computed once per weights
    b.output(b.matmul(x, w))
    costs = session.op_costs(b.build())
    assert [c.op for c in costs] == ["matmul"] and session.graph_flops(b.build()) == 2 * 2 * 4 * 6


def test_roofline_versions_keep_flops_and_lose_the_executed_saving():
    g = ffn()
    trace = run_passes(g, ["fuse_matmul_bias_act", "fuse_residual_ln"])
    rows = session.roofline(trace, "cpu")
    assert [r.label for r in rows] == ["input", "after fuse_matmul_bias_act", "after fuse_residual_ln"]
    assert {r.flops for r in rows} == {session.graph_flops(g)} == {session.graph_flops(trace.final)}
    assert rows[0].bytes == rows[0].ideal_bytes == session.program_bytes(g)
    for prev, row, step in zip(rows[:-1], rows[1:], trace.steps, strict=True):
        ex = session.executed_traffic_saved(step, "cpu")
        assert prev.bytes - row.bytes == ex.total  # the same numbers as the traffic view
        assert prev.ideal_bytes - row.ideal_bytes == ex.ideal.total
    # on the CPU neither fusion changes the bytes MLX moves (addmm pre-fills the bias; add + layer_norm stay two)
    assert rows[-1].intensity == rows[0].intensity < rows[-1].ideal_intensity
    gpu = session.roofline(trace, "gpu")
    assert gpu[-1].intensity > gpu[0].intensity  # a GEMM epilogue reads the bias on the GPU (a model)


def test_roofline_of_a_model_run_counts_horizontal_reads():
    from rlxviz.models import load_model

    m = load_model("minilm", batch=1, seq=8)
    trace = Pipeline.canonical().run(m.graph)
    rows = session.roofline(trace, "cpu")
    k = [s.pass_name for s in trace.steps].index("fuse_shared_input_matmul") + 1
    reads, _ = session.shared_input_saved(trace.steps[k - 1])
    assert reads > 0 and rows[k - 1].bytes - rows[k].bytes == reads
    assert rows[-1].flops == session.graph_flops(trace.final)  # each version: its own decomposition
    assert abs(rows[-1].flops - rows[0].flops) < 1e-3 * rows[0].flops  # canonicalization and DCE change little


def test_roofline_refuses_a_fused_input():
    trace = run_passes(ffn(), ["fuse_matmul_bias_act"])
    with pytest.raises(ValueError, match="fused ops"):
        session.roofline(run_passes(trace.final, ["fuse_residual_ln"]))


def test_machine_ridge_is_measured():
    r = session.machine_ridge("cpu", n=64, elements=1 << 12, repeat=2)
    assert r.gflops > 0 and r.gbps > 0 and r.ridge == r.gflops / r.gbps and r.device == "cpu"


def test_transcendental_flops_follow_the_fast_formulation():
    from rlxviz.runtime import fast

    erf = 2 + 1 + 2 * (len(fast._ERF_P) - 1) + 2 * (len(fast._ERF_Q) - 1) + 2
    tanh = 2 + 1 + 2 * (len(fast._TANH_P) - 1) + 2 * (len(fast._TANH_Q) - 1) + 2
    assert session.ERF_FLOPS == erf == 25
    from rlxviz.ir import Op
    from rlxviz.session.roofline import TRANSCENDENTAL_FLOPS

    assert TRANSCENDENTAL_FLOPS[Op.TANH] == tanh and TRANSCENDENTAL_FLOPS[Op.GELU] == erf + 4
    assert 25 <= TRANSCENDENTAL_FLOPS[Op.GELU] <= 30


def test_bound_and_attainable_time_read_the_ridge():
    r = session.Ridge("cpu", gflops=100.0, gbps=10.0, matmul_ms=1.0, add_ms=1.0)
    assert r.ridge == 10.0
    assert session.bound(12.0, r) == "compute" and session.bound(2.0, r) == "memory"
    assert session.attainable_ms(1_000_000, 10, r) == 1_000_000 / 1e8
    assert session.attainable_ms(10, 1_000_000, r) == 1_000_000 / 1e7
