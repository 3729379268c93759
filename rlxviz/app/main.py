"""The Panel application's template (a first cut: the IR of a built-in graph)."""

from __future__ import annotations

import panel as pn

from ..ir import Builder, format_graph


def build_app() -> pn.template.BaseTemplate:
    """The app template; `app.py` calls `.servable()` on it."""
    b = Builder("mlp")
    x = b.input("x", (2, 8, 16))
    with b.scope("fc"):
        y = b.gelu(b.linear(x, b.param("fc.weight", (16, 32)), b.param("fc.bias", (32,))))
    b.output(y)
    tmpl = pn.template.FastListTemplate(title="rlxviz")
    tmpl.main.append(pn.pane.Markdown("```\n" + format_graph(b.build()) + "```"))
    return tmpl
