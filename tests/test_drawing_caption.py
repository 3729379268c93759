"""A drawing's title is its DOT label when the drawing stands alone (`rlxviz render`, a downloaded SVG) and HTML text
above it in the app (`session.render.caption`: the app's SVG carries none), one wording for both (rlxviz issue 39:
the Why drawing's title was 4-5 px high at fit zoom)."""

from __future__ import annotations

import html
from pathlib import Path

from test_layer_titles import ESM, GRANITE, _trace

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView
from rlxviz.session.render import View, caption, dot, picture, svg

ESM_ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "esm.dynamo-eager.onnx"


def _label(dot_text: str) -> str | None:
    """The graph's own label in DOT text (the line `label="..."` at the graph's level), unescaped, or None."""
    for line in dot_text.splitlines():
        if line.startswith("\tlabel=") or line.startswith("\tgraph [") and " label=" in line:
            return html.unescape(line.split("label=", 1)[1].strip().strip('"'))
    return None


def test_a_titled_drawing_carries_the_caption_an_untitled_one_none():
    for path in (GRANITE, ESM):
        t = _trace(path)
        for v in (View(len(t.steps), "full", "why", 0), View(3, "full", "before"), View(3, "layers"),
                  View(3, "full", "after", 1)):
            cap = caption(t, v)
            assert cap and cap in html.unescape(dot(t, v)), (v, cap)
            assert cap not in html.unescape(dot(t, v, titled=False)), v
            assert _label(dot(t, v, titled=False)) is None
        why = View(len(t.steps), "full", "why", 0)
        assert caption(t, why) == picture(t, why)[1].title + " — layer 0"
        assert "in this layer" in html.unescape(svg(t, why)) and "in this layer" not in svg(t, why, titled=False)


def test_the_app_shows_the_why_title_above_an_untitled_drawing_and_downloads_it_titled():
    s = AppState(runner=Runner(background=False))
    view = WhyView(state=s)
    s.load_upload({ESM_ZOO.name: ESM_ZOO.read_bytes()})
    s.selected_layer = 0
    cap = view.graph.caption
    assert "alone it is not enough: qkv_packed" in cap and "before fuse_attention_block, in this layer: " in cap, cap
    assert "in this layer" not in view.graph.svg and view.graph.svg
    last = len(s.version_labels) - 1
    assert s.caption(last) in html.unescape(s.svg(last, titled=True)) and s.caption(last) not in s.svg(last)
