"""The error overlay drew ordinary f32 results orange: its legend said "f32 rounds at 1.2e-07" while an f32 sum of K
products rounds up to K x eps (an f32 matmul over K = 384 to 4.6e-5), so matmul and attention outputs landed in the
1e-6..1e-5 bins. Now each node has the rounding expected for it (`session.overlays.expected_rounding`, from its
longest sum), an error within it takes the lightest fill, and the legend says what orange means; the absolute
errors stay printed."""

from __future__ import annotations

import numpy as np
import pytest

from rlxviz import session
from rlxviz.ir import DType
from rlxviz.ir.builder import Builder
from rlxviz.runtime.precision import TABLE
from rlxviz.session.overlays import (
    EPS,
    UNITS,
    NodeFigures,
    expected_rounding,
    heat,
    node_figures,
    reduction_length,
)
from rlxviz.viz.heat import PALETTE, bin_of, heat_colors, legend


def small(k: int, n: int = 8):
    """x[2, k] @ w[k, n] + b, gelu, a sum over its last axis: (graph, ids)."""
    b = Builder()
    x = b.input("x", (2, k))
    mm = b.matmul(x, b.param("w", (k, n)))
    add = b.add(mm, b.param("b", (n,)))
    act = b.gelu(add)
    red = b.reduce_sum(act, (1,))
    b.output(red)
    return b.build(), (x, mm, add, act, red)


@pytest.mark.parametrize("k", [16, 384, 1536])
def test_a_matmul_and_what_follows_it_round_like_a_sum_of_k_products(k):
    g, (x, mm, add, act, red) = small(k)
    assert [reduction_length(g, i) for i in (mm, add, act, red)] == [k, 1, 1, 8]
    exp = expected_rounding(g)
    eps = EPS["f32"]
    assert exp[mm] == pytest.approx(k * eps) and exp[add] == exp[act] == exp[mm]  # the bias add inherits the sum
    assert exp[red] == pytest.approx(max(k, 8) * eps) and exp[x] == pytest.approx(eps)
    cap = TABLE[DType.f32, "cpu"][0].rtol  # the product's own "same numbers" tolerance vs the oracle
    assert max(expected_rounding(g, cap).values()) <= cap


def test_the_cap_is_the_checks_own_tolerance():
    g, (_x, mm, *_r) = small(20000)
    cap = TABLE[DType.f32, "cpu"][0].rtol
    assert expected_rounding(g)[mm] > cap and expected_rounding(g, cap)[mm] == cap


def figs(values: dict[int, float], expected: dict[int, float]) -> NodeFigures:
    return NodeFigures("error", 1, "after fuse", values, scales={i: 1.0 for i in values}, expected=expected)


def test_an_error_within_its_rounding_is_light_and_one_past_it_is_warm():
    rounding = 384 * EPS["f32"]  # a matmul over 384: 4.6e-5
    f = figs({1: 5e-6, 2: 3e-5, 3: 5e-4, 4: float("nan")}, {1: rounding, 2: rounding, 3: rounding, 4: rounding})
    fills = {i: fill for i, fill, _tip in heat(f)}
    assert bin_of("error", 5e-6) >= 2 and bin_of("error", 3e-5) >= 3  # the old bins: orange
    assert fills[1] == fills[2] == PALETTE[0]
    assert fills[3] == PALETTE[bin_of("error", 5e-4)] != PALETTE[0]
    assert fills[4] not in PALETTE  # not finite keeps its own fill
    tips = {i: tip for i, _fill, tip in heat(f)}
    assert "abs 5e-06" in tips[1] and "within the rounding expected" in tips[1]  # the absolute error still printed
    assert "past the rounding expected" in tips[3]
    # without an expectation (a quantized graph's judge), the bins alone
    assert {i: c for i, c, _ in heat(figs({1: 5e-6}, {}))}[1] == PALETTE[bin_of("error", 5e-6)]
    assert heat_colors("error", {1: 5e-6}, {1}) == {1: PALETTE[0]}


def test_the_legend_says_what_the_light_and_the_warm_fills_mean():
    first = legend("error")[0]
    assert first[0] == PALETTE[0] and "rounding" in first[1]
    unit = UNITS["error"]
    assert "within the rounding expected for the node" in unit and "orange" in unit and "past that rounding" in unit
    assert "rounding" not in legend("time")[0][1]


@pytest.mark.parametrize("preset,final", [("bert-tiny", False), ("bert-tiny", True), ("llama-block", True)])
def test_ordinary_f32_results_are_not_drawn_warm(preset, final):
    """A small model's input or final version on MLX in f32: every node's error is within the rounding expected for
    it, so the overlay draws none of them warm (before, its matmuls and attention landed in the 1e-6..1e-5 bins)."""
    m = session.load(preset, 1, 8)
    tr = session.run_pipeline(m.graph, session.build_pipeline())
    f = node_figures(tr, len(tr.steps) if final else 0, "error", m.random_feeds(seed=0), m.weights)
    finite = [i for i, v in f.values.items() if np.isfinite(v) and v > 0]
    assert finite and f.expected and all(f.rounding(i) for i in finite), [f.figure(i) for i in finite]
    fills = {i: c for i, c, _ in heat(f)}
    assert {fills[i] for i in finite} == {PALETTE[0]}
