"""Per-node figures as fill colours: fixed bins over Bokeh's ColorBrewer `YlOrRd` palette, and the legend.

The bins are fixed per kind (not scaled to the graph), so a colour means the same figure in every version and
every model: time share in steps of the per-node total, error in decades of max |value - reference| over max
|reference| (the tensor's scale; a value off by a percent of its scale takes the darkest, whatever the tensor's
units). f32 rounds at 1.2e-7 per operation, but a sum of K products rounds up to K x that (an f32 matmul over
K = 384 to 4.6e-5): an error within the rounding expected for its node (`session.overlays.expected_rounding`,
passed as `rounding`) takes the lightest fill whatever its bin, so ordinary f32 matmul and attention outputs are
not drawn orange; orange to red means past that rounding. A node without a figure is drawn grey (`UNCOLOURED`, as
are the collapsed view's layer boxes), never in its op colour; a non-finite error gets `NONFINITE`.

Example:
    >>> heat_colors("error", {3: 2e-6, 4: 0.0})
    {3: '#feb24c', 4: '#ffffb2'}
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from functools import cache


@cache
def _palette() -> tuple[str, ...]:
    """Seven fills from light (small) to dark (large): ColorBrewer's YlOrRd as Bokeh ships it.

    Imported on first use, so the CLI's `run`/`time` paths (which draw nothing) do not load Bokeh."""
    from bokeh.palettes import YlOrRd

    return tuple(reversed(YlOrRd[7]))


def __getattr__(name: str) -> tuple[str, ...]:
    """`PALETTE`: `_palette()`, resolved on first access (PEP 562)."""
    if name == "PALETTE":
        return _palette()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

NONFINITE = "#7b3294"
"""Fill of a node whose error is not finite (nan / inf where the reference is finite, or the other way)."""

UNCOLOURED = "#eeeeee"
"""Fill of whatever an overlay's figures do not colour while it is on: a node without a figure (a param, a node the
pass removed, one computed once from the weights) and every layer box of the collapsed view. Their op and status
fills read as the legend's (a "partly fused" box's yellow as 1e-07–1e-06, a tan add as orange); a grey with no hue
reads as none of them (`UNCOLOURED_ROW` says so in the legend)."""

UNCOLOURED_ROW = (UNCOLOURED, "not coloured")
"""The legend's last swatch while an overlay is on (`app.derived.overlay_legend`): what `UNCOLOURED` means, short
(the error legend's nine swatches fit one line beside the open sidebar at 1280 px)."""

EDGES: dict[str, tuple[float, ...]] = {
    "time": (0.01, 0.02, 0.05, 0.10, 0.20, 0.40),
    "error": (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
}
"""Upper edges of the first six bins per kind (the seventh is open): time as a fraction of the per-node total,
error relative to the tensor's scale (`session.overlays.NodeFigures.relative`): under 1e-7 is exact to f32's
epsilon, 1e-4..1e-3 holds f16's (9.8e-4), 1e-2 and above bf16's (7.8e-3) and real faults."""

MIN_CONTRAST = 4.5
"""WCAG 2's least contrast ratio for normal text (level AA): every label on an overlay fill reaches it."""


def bin_of(kind: str, value: float) -> int:
    """Bin index 0..6 of `value` (`EDGES[kind]`); -1 for a non-finite value."""
    if not math.isfinite(value):
        return -1
    return sum(value >= e for e in EDGES[kind])


def heat_colors(kind: str, values: Mapping[int, float], rounding: Collection[int] = ()) -> dict[int, str]:
    """Node id -> fill for each figure (`values`: time shares 0..1, or relative errors); the nodes in `rounding`
    (an error within its node's expected rounding, `session.overlays.NodeFigures.rounding`) take the lightest fill."""
    return {i: NONFINITE if (b := bin_of(kind, v)) < 0 else _palette()[0 if i in rounding else b]
            for i, v in values.items()}


_NAMED = {"white": "#ffffff", "black": "#000000"}


def linear_rgb(color: str) -> tuple[float, float, float]:
    """The linear-light R, G, B (0..1) of an sRGB colour, `#rrggbb`, `#rgb`, `white` or `black` (the sRGB transfer
    function undone, IEC 61966-2-1): what `luminance` and `styles.lab` weigh.

    Raises:
        ValueError: any other spelling (a Graphviz colour name, `rgb(...)`)."""
    c = _NAMED.get(color.lower(), color.lower())
    if len(c) == 4 and c.startswith("#"):
        c = "#" + "".join(ch * 2 for ch in c[1:])
    if len(c) != 7 or not c.startswith("#") or any(ch not in "0123456789abcdef" for ch in c[1:]):
        raise ValueError(f"not a #rrggbb colour: {color!r}")
    r, g, b = ((v / 12.92) if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
               for v in (int(c[k:k + 2], 16) / 255 for k in (1, 3, 5)))
    return r, g, b


def luminance(color: str) -> float:
    """WCAG 2 relative luminance (0 black .. 1 white) of an sRGB colour, `#rrggbb`, `#rgb`, `white` or `black`.

    Raises:
        ValueError: any other spelling (a Graphviz colour name, `rgb(...)`)."""
    r, g, b = linear_rgb(color)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two colours (1 .. 21; `luminance`'s spellings): (lighter + 0.05) / (darker + 0.05)."""
    la, lb = sorted((luminance(a), luminance(b)))
    return (lb + 0.05) / (la + 0.05)


def text_color(fill: str) -> str:
    """The label colour on `fill`, from its luminance: `white` or `black`, whichever contrasts more (white on the
    dark fills, black on the light ones). Every overlay's fills (`PALETTE`, `NONFINITE`) reach `MIN_CONTRAST`
    with it; a mid-grey fill could not (neither reaches 4.5 on about #777777)."""
    return "white" if contrast("#ffffff", fill) > contrast("#000000", fill) else "black"


def readable_on(color: str, fill: str) -> str:
    """`color` where it reaches `MIN_CONTRAST` on `fill`, else `text_color(fill)`: a label's coloured line (a grey
    shape, a green "by pass") keeps its colour on a light fill and turns white on a dark one. A colour
    `luminance` cannot read counts as unreadable."""
    try:
        return color if contrast(color, fill) >= MIN_CONTRAST else text_color(fill)
    except ValueError:
        return text_color(fill)


def _fmt(kind: str, x: float) -> str:
    return f"{x:.0%}" if kind == "time" else f"{x:.0e}"


def legend(kind: str) -> list[tuple[str, str]]:
    """(fill, range in words) per bin, small to large, then the non-finite fill for `error`; the error's lightest
    fill also holds every error within its node's expected rounding (`< 1e-07 or rounding`; the unit line,
    `session.overlays.UNITS`, says what that rounding is and that orange means past it)."""
    e = EDGES[kind]
    palette = _palette()
    first = f"< {_fmt(kind, e[0])}" + (" or rounding" if kind == "error" else "")  # `heat_colors`' `rounding`
    rows = [(palette[0], first)]
    rows += [(palette[k], f"{_fmt(kind, e[k - 1])} – {_fmt(kind, e[k])}") for k in range(1, len(e))]
    rows.append((palette[len(e)], f"≥ {_fmt(kind, e[-1])}"))
    if kind == "error":
        rows.append((NONFINITE, "not finite"))
    return rows


__all__ = ["EDGES", "MIN_CONTRAST", "NONFINITE", "UNCOLOURED", "UNCOLOURED_ROW", "bin_of", "contrast", "heat_colors",
           "legend", "linear_rgb", "luminance", "readable_on", "text_color"]
