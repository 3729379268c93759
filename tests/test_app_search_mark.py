"""The graph search's own mark (issue 39): found nodes were filled the yellow of a "partly fused" layer box, so a
found box read as a partial fusion. The mark is now a colour no drawing gives a meaning to, drawn as an outline
(the fill, a status, stays), and the search's legend names it. No browser: the pane's CSS and script are text."""

import json
import re

from rlxviz.app.graphpane import _CSS, _ESM
from rlxviz.viz import styles
from rlxviz.viz.styles import STATUS_COLORS, meaningful_colors


def _rgb(c: str) -> tuple[int, int, int]:
    c = c.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


def _distance(a: str, b: str) -> float:
    return sum((x - y) ** 2 for x, y in zip(_rgb(a), _rgb(b), strict=True)) ** 0.5


def _rule(selector_part: str) -> str:
    """The body of the first CSS rule whose selector holds `selector_part` (ends with it, for a trailing `$`)."""
    for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", _CSS):
        sel = " ".join(sel.split())
        if (sel.endswith(selector_part[:-1]) if selector_part.endswith("$") else selector_part in sel):
            return body
    raise AssertionError(selector_part)


def test_the_search_mark_differs_from_every_colour_the_drawings_give_a_meaning():
    colors = meaningful_colors()
    for status, fill in STATUS_COLORS.items():  # the layer boxes' status fills are among them
        assert colors[f"status {status}"] == fill
    near = {what: c for what, c in colors.items() if _distance(c, styles.SEARCH_MARK) < 100}
    assert not near, f"the search mark {styles.SEARCH_MARK} is close to {near}"
    assert styles.SEARCH_MARK.lower() not in {c.lower() for c in colors.values()}


def test_a_found_node_keeps_its_fill_and_gets_the_search_outline():
    found = _rule("g.rv-found-node polygon")
    assert "fill" not in found, found  # the status (or op) fill stays visible under a hit
    assert styles.SEARCH_MARK in found and "stroke-width" in found
    for fill in STATUS_COLORS.values():  # no status colour anywhere in the search's marks
        assert fill not in found and fill not in _rule(".rv-found-note")
    assert styles.SEARCH_MARK in _rule("g.rv-found-node$")  # the glow: a shape no other mark has
    # the selection and the highlight are drawn after the search mark, so they stay on top of a found node
    assert _CSS.index("rv-found-node polygon") < _CSS.index("g.rv-hl polygon") < _CSS.index("g.rv-sel polygon")


def test_the_search_legend_names_the_mark():
    key = styles.search_key()
    assert styles.SEARCH_MARK_WORDS in key and "magenta" in key and "partly fused" in key
    assert styles.SEARCH_MARK in _rule(".rv-found.rv-hits::before")  # the counter's swatch
    assert "__SEARCH_KEY__" not in _ESM and json.dumps(key) in _ESM  # the search box's and the counter's tooltip
    assert "__" not in re.sub(r"__\w+__\(", "", _CSS)  # every placeholder filled
