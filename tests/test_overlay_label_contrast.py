"""Overlay labels stay readable (issue 39): on every fill of the time-share and error overlays (`viz.heat`) a node's
label, every coloured line of it included (the grey `%id` and shape, a fused node's green "by pass", a match's
role), reaches WCAG's 4.5 contrast; one function (`heat.text_color`, `heat.readable_on`) picks it from the fill's
luminance for both overlays."""

import re

import pytest

from rlxviz import session
from rlxviz.session import render
from rlxviz.viz.heat import MIN_CONTRAST, NONFINITE, contrast, legend, luminance, readable_on, text_color


def test_wcag_luminance_and_contrast():
    assert luminance("#ffffff") == pytest.approx(1.0) and luminance("black") == 0.0
    assert contrast("#000", "white") == pytest.approx(21.0) and contrast("#777777", "#777777") == pytest.approx(1.0)
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)  # the lightest grey AA allows on white
    with pytest.raises(ValueError, match="rrggbb"):
        luminance("orchid")


@pytest.mark.parametrize("kind", ["time", "error"])
def test_every_bin_of_each_overlay_palette_gets_a_label_colour_of_contrast_4_5(kind):
    fills = [fill for fill, _ in legend(kind)]
    assert (NONFINITE in fills) == (kind == "error")
    for fill in fills:
        assert contrast(text_color(fill), fill) >= MIN_CONTRAST, (kind, fill, text_color(fill))
    # the colour follows luminance: white on the darkest bin, black on the lightest
    assert text_color(fills[0]) == "black" and text_color(legend(kind)[len(legend("time")) - 1][0]) == "white"


@pytest.mark.parametrize("fill,expect", [("#ffffff", "black"), ("#000000", "white"), ("#1565c0", "white"),
                                         ("#fff59d", "black"), ("#7b3294", "white"), ("#fd8d3c", "black")])
def test_label_colour_is_chosen_by_luminance_for_any_fill(fill, expect):
    assert text_color(fill) == expect and contrast(expect, fill) >= MIN_CONTRAST


def test_a_coloured_line_keeps_its_colour_only_where_it_is_readable():
    assert readable_on("#1b5e20", "#ffffb2") == "#1b5e20"  # dark green on the lightest bin: kept
    assert readable_on("#777777", "#b10026") == "white"  # grey on the darkest: the fill's label colour
    assert readable_on("#333333", "#e31a1c") == "white" and readable_on("not-a-colour", "#ffffb2") == "black"


def _node_colours(dot: str) -> dict[str, tuple[str, list[str]]]:
    """Node id -> (fill, [fontcolor, every FONT COLOR of its label]) from DOT source."""
    out = {}
    for m in re.finditer(r'^\s*(n\d+) \[(.*)\]$', dot, flags=re.M):
        attrs = m[2]
        fill = re.search(r'fillcolor="?([#\w]+)"?', attrs)
        font = re.search(r'fontcolor="?([#\w]+)"?', attrs)
        if fill is None or font is None:
            continue
        out[m[1]] = (fill[1], [font[1], *re.findall(r'COLOR="([^"]+)"', attrs)])
    return out


@pytest.fixture(scope="module")
def trace():
    m = session.load("bert-tiny", 2, 8)
    return session.run_pipeline(m.graph, session.build_pipeline())


@pytest.mark.parametrize("kind", ["time", "error"])
@pytest.mark.parametrize("side", ["after", "before"])
def test_every_line_of_a_heat_filled_node_label_reads_on_its_fill(trace, kind, side):
    """Each node of a fused version (after: green "by pass" and "absorbed" lines; before: the match's roles in its
    colours, folded weights) takes one overlay fill in turn, every bin; each of its label's colours reaches 4.5 on
    that fill. Before the fix the grey and green lines stayed as they were on the darkest bins (about 1.1)."""
    k = next(i for i, s in enumerate(trace.steps, 1) if s.matches)  # a pass that fused something
    g = trace.steps[k - 1].before if side == "before" else trace.steps[k - 1].after
    fills = [fill for fill, _ in legend(kind)]
    ids = [n.id for n in g.compute_nodes()]
    heat = tuple((i, fills[j % len(fills)], f"{kind}: x") for j, i in enumerate(ids))
    colours = _node_colours(render.dot(trace, render.View(k, side=side), heat))
    given = dict((i, f) for i, f, _ in heat)
    checked = 0
    for i, fill in given.items():
        if f"n{i}" not in colours or colours[f"n{i}"][0] != fill:  # a node drawn apart (removed, folded)
            continue
        for c in colours[f"n{i}"][1]:
            assert contrast(c, fill) >= MIN_CONTRAST, (i, fill, c, contrast(c, fill))
        checked += 1
    assert checked >= len(fills) * 2  # every bin drawn, on several nodes
    dark = [i for i, f in given.items() if f == fills[len(legend("time")) - 1] and f"n{i}" in colours]
    assert dark and all(set(colours[f"n{i}"][1]) == {"white"} for i in dark)  # the darkest bin reads all white
