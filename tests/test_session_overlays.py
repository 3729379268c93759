"""Per-node overlays (`session.overlays`): node identity across versions, the error of each node against version
0's reference, the time share, their bounds (memory budget, time limit), the colours (`viz.heat`) and the CLI."""

import pytest
from clirun import one_line_error, run

from rlxviz import session
from rlxviz.runtime.compare import max_abs
from rlxviz.runtime.executor import MlxExecutor, static_ids
from rlxviz.runtime.reference import run_oracle
from rlxviz.session.overlays import NodeFigures, heat, node_figures, origins
from rlxviz.viz.heat import EDGES, NONFINITE, PALETTE, bin_of, heat_colors, legend

ARCHS = [("bert-tiny", "rlx"), ("bert-tiny", "hf"), ("llama-block", "hf"), ("minilm-shaped", "hf")]


def _run(preset, style="hf", variant="none"):
    m = session.load(preset, 2, 8, style=style, variant=variant)
    return m, session.run_pipeline(m.graph, session.build_pipeline())


@pytest.mark.parametrize("preset,style", ARCHS)
def test_every_node_but_a_packed_value_has_a_counterpart_of_its_type_in_version_0(preset, style):
    """Kept nodes are themselves, fused nodes the node whose readers they took; only values no version 0 node
    holds (a pass's concat of weights, the matmul on that packed weight) have no counterpart."""
    _m, tr = _run(preset, style)
    g0 = tr.input
    for k, (_label, g) in enumerate(tr.versions()):
        o = origins(tr, k)
        for n in g.compute_nodes():
            if n.id not in o:
                packed = n.op.value == "concat" or any(g[i].op.value == "concat" for i in n.inputs)
                assert n.pass_name and packed, (k, n.id, n.op.value)
                continue
            assert g0[o[n.id]].type == n.type
            if n.id in g0:
                assert o[n.id] == n.id
        if k == len(tr.steps):
            fused = [n for n in g.compute_nodes() if n.pass_name and n.op.value not in ("concat", "matmul", "narrow")]
            assert fused and all(n.id in o for n in fused)


@pytest.mark.parametrize("preset,style", ARCHS)
def test_output_error_is_the_whole_graph_error(preset, style):
    """The figure of the final graph's output node equals max |MLX(final) - oracle(input)| computed directly: the
    matching found the node whose value the output stands for."""
    m, tr = _run(preset, style)
    feeds = m.random_feeds(seed=0)
    k = len(tr.steps)
    figs = node_figures(tr, k, "error", feeds, m.weights)
    final = tr.final
    got = MlxExecutor(device="cpu").run(final, feeds, m.weights)
    want = run_oracle(tr.input, feeds, m.weights)
    for j, out in enumerate(final.outputs):
        assert figs.values[out] == pytest.approx(max_abs([got[j]], [want[j]], same_nonfinite=True), rel=1e-6, abs=0)
    assert all(v < 1e-4 for v in figs.values.values())
    assert set(figs.values) == {n.id for n in final.compute_nodes()} - set(figs.unmatched)


def test_a_wrong_value_shows_at_its_node(monkeypatch):
    """A version whose one fused node's value is off by 0.5: that node, and no other, carries an error of 0.5, in
    the darkest colour; as computed, every node's f32 rounding takes one of the two lightest."""
    m, tr = _run("bert-tiny")
    feeds = m.random_feeds(seed=0)
    k = len(tr.steps)
    clean = node_figures(tr, k, "error", feeds, m.weights)
    assert clean.values and all(bin_of("error", clean.relative(i)) <= 1 for i in clean.values), clean.lines()
    target = next(n.id for n in tr.final.compute_nodes() if n.pass_name and n.id in origins(tr, k))
    eager = MlxExecutor.eager

    def off(self, graph, *a, **kw):
        for n, v, s in eager(self, graph, *a, **kw):
            yield n, (v + 0.5 if n.id == target else v), s

    monkeypatch.setattr(MlxExecutor, "eager", off)
    figs = node_figures(tr, k, "error", feeds, m.weights)
    assert figs.values[target] == pytest.approx(0.5, abs=1e-4)
    assert max(v for i, v in figs.values.items() if i != target) < 1e-4
    assert figs.lines(tr.final)[0].startswith(f"%{target} ")
    assert dict((i, f) for i, f, _ in heat(figs))[target] == PALETTE[-1]


def test_time_shares_sum_to_one_and_the_limit_stops_between_nodes():
    m, tr = _run("bert-tiny")
    feeds = m.random_feeds(seed=0)
    g = tr.final
    figs = node_figures(tr, len(tr.steps), "time", feeds, m.weights, repeat=1)
    once = static_ids(g)  # weights-only nodes (the position table's narrows): computed once per program
    assert once & {n.id for n in g.compute_nodes()}, "bert-tiny's final version reads a weights-only narrow"
    assert set(figs.values) == {n.id for n in g.compute_nodes()} - once
    assert figs.note.startswith(f"{len(once & {n.id for n in g.compute_nodes()})} node(s) that read only weights")
    assert sum(figs.share(i) for i in figs.values) == pytest.approx(1.0)
    part = node_figures(tr, 0, "time", feeds, m.weights, repeat=1, time_limit_s=1e-9)
    assert len(part.values) == 1 and "time limit" in part.note


def test_memory_budget_refuses_before_running():
    m, tr = _run("bert-tiny")
    with pytest.raises(session.LimitError, match="over the limit"):
        node_figures(tr, 1, "error", m.random_feeds(seed=0), m.weights, limits=session.Limits(0.01))
    with pytest.raises(session.SessionError, match="unknown overlay"):
        node_figures(tr, 1, "speed", m.random_feeds(seed=0), m.weights)
    with pytest.raises(session.SessionError, match="not in this run"):
        node_figures(tr, 99, "time", m.random_feeds(seed=0), m.weights)


def test_bins_colours_and_legend():
    assert [bin_of("error", x) for x in (0.0, 5e-8, 1e-7, 3e-5, 1e-2, 1.0)] == [0, 0, 1, 3, 6, 6]
    assert bin_of("error", float("nan")) == -1 and bin_of("time", 0.5) == 6
    assert heat_colors("error", {1: float("inf"), 2: 0.0}) == {1: NONFINITE, 2: PALETTE[0]}
    rows = legend("time")
    assert len(rows) == len(EDGES["time"]) + 1 and rows[0] == (PALETTE[0], "< 1%") and rows[-1][1] == "≥ 40%"
    assert legend("error")[-1] == (NONFINITE, "not finite")


def test_error_colours_read_the_tensors_scale():
    """The same f32 rounding (1e-7 of max |reference|) in a tensor of scale 4 and one of scale 4000 takes the same
    bin (by absolute error the second took the third-darkest bin); an error of 1% of the scale takes the darkest."""
    figs = NodeFigures("error", 1, "after x", values={1: 4e-7, 2: 4.4e-4, 3: 40.0, 4: 0.0, 5: 2e-3},
                       scales={1: 4.0, 2: 4000.0, 3: 4000.0, 4: 1.0, 5: 0.0})
    fills = {i: f for i, f, _ in heat(figs)}
    assert fills[1] == fills[2] == PALETTE[1] and fills[3] == PALETTE[-1] and fills[4] == PALETTE[0]
    assert fills[5] == PALETTE[bin_of("error", 2e-3)]  # an all-zero reference: the error as it is
    assert figs.figure(2) == "1.1e-07 of max |ref| 4e+03 (abs 0.00044)" and figs.figure(4) == "0 (exact)"
    assert [ln.split()[0] for ln in figs.lines()] == ["%3", "%5", "%2", "%1", "%4"]  # ordered by the relative error


def test_heat_colours_the_drawing_and_names_the_figure_in_the_tooltip():
    from rlxviz.session import render

    m, tr = _run("bert-tiny")
    k = len(tr.steps)
    figs = node_figures(tr, k, "time", m.random_feeds(seed=0), m.weights, repeat=1)
    h = heat(figs)
    top = max(figs.values, key=figs.values.get)
    dot = render.dot(tr, render.View(k), h)
    fill = dict((i, f) for i, f, _ in h)[top]
    assert f'id=n{top}' in dot and fill in dot and f"time: {figs.figure(top)}" in dot
    assert fill not in render.dot(tr, render.View(k))  # without the overlay the op colours stay


def test_cli_overlay_prints_the_same_figures(capsys):
    code, out, _ = run(capsys, "overlay", "bert-tiny", "--batch", "2", "--seq", "8", "--kind", "error", "--top", "3")
    assert code == 0 and out.startswith("error per node, after ") and "max |value - reference of version 0|" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("%")]) == 3
    code, _, err = run(capsys, "overlay", "bert-tiny", "--time-limit", "0")
    assert code == 2
    one_line_error(err, "overlay", "--time-limit must be a positive number")


def test_heat_before_colours_the_nodes_the_pass_kept():
    """The "before" pane's fills: the figures of the nodes a pass kept (same id, op and type before and after it),
    in the after pane's colours; the nodes it replaced keep their op colours (the overlay coloured the after pane
    only); none for the input, which no pass precedes."""
    from rlxviz.session.overlays import NodeFigures, heat_before

    _m, tr = _run("bert-tiny")
    k = next(i for i, s in enumerate(tr.steps, 1) if s.matches)  # a pass that fused something
    after, before = tr.versions()[k][1], tr.steps[k - 1].before
    values = {n.id: 0.1 + 0.01 * j for j, n in enumerate(after.compute_nodes())}
    figs = NodeFigures("time", k, tr.versions()[k][0], values, sum(values.values()))
    got = {i: (fill, tip) for i, fill, tip in heat_before(figs, tr)}
    kept = {i for i in values if i in before and before[i].op == after[i].op and before[i].type == after[i].type}
    assert got and set(got) == kept and set(values) - kept  # some nodes are new: those have no colour
    assert {i: f for i, f, _ in heat(figs) if i in kept} == {i: f for i, (f, _) in got.items()}
    assert all("kept" in tip for _, tip in got.values())
    assert heat_before(NodeFigures("time", 0, "input", values, 1.0), tr) == ()


def test_a_packed_weight_concat_has_no_time_share():
    """Newcomer run 4: the time overlay charged the packed Q/K/V weights' `concat` 2-5% each, as if computed per
    call; a program computes a weights-only node once, when it is prepared (`static_ids`), so it has no share."""
    m, tr = _run("llama-block")
    k = 1 + [s.pass_name for s in tr.steps].index("fuse_shared_input_matmul")
    g = tr.versions()[k][1]
    packs = [n.id for n in g.compute_nodes() if n.op.value == "concat" and n.id in static_ids(g)]
    assert packs, "llama-block's Q/K/V weights are packed by a concat of params"
    figs = node_figures(tr, k, "time", m.random_feeds(seed=0), m.weights, repeat=1)
    assert not set(packs) & set(figs.values) and "concat" in figs.note and "once" in figs.note
    assert sum(figs.share(i) for i in figs.values) == pytest.approx(1.0)
