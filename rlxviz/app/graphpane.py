"""`SvgGraph`: a Graphviz SVG in the browser with pan, zoom, click-to-select and highlighting.

The renderer gives every node a DOT id `n<id>` that survives into the SVG (`<g id="n12" class="node">`),
so a click maps back to the IR node id, and highlighting is a CSS class on those groups. Pan with
the mouse (drag), zoom with the wheel or the +/- buttons, "fit" to see the whole graph.
"""

from __future__ import annotations

import param
from panel.custom import JSComponent

_ESM = r"""
export function render({ model, el }) {
  const bar = document.createElement('div'); bar.className = 'rv-bar';
  const title = document.createElement('span'); title.className = 'rv-title';
  const mk = (txt, tip, fn) => { const b = document.createElement('button'); b.textContent = txt; b.title = tip;
    b.className = 'rv-btn'; b.addEventListener('click', (e) => { e.stopPropagation(); fn(); }); bar.appendChild(b); return b; };
  bar.appendChild(title);
  const wrap = document.createElement('div'); wrap.className = 'rv-wrap';
  const inner = document.createElement('div'); inner.className = 'rv-inner';
  wrap.appendChild(inner); el.appendChild(bar); el.appendChild(wrap);
  Object.assign(el.style, { display: 'flex', flexDirection: 'column', width: '100%', height: '100%' });
  let s = 1, tx = 0, ty = 0;
  const apply = () => { inner.style.transform = `translate(${tx}px, ${ty}px) scale(${s})`; };
  const size = () => { const svg = inner.querySelector('svg'); if (!svg) return null;
    const vb = svg.viewBox && svg.viewBox.baseVal; const w = (vb && vb.width) || svg.clientWidth || 1;
    const h = (vb && vb.height) || svg.clientHeight || 1; return [w, h]; };
  const fit = () => { const sz = size(); if (!sz) return; const W = wrap.clientWidth || 600;
    const H = wrap.clientHeight || 500; s = Math.min(W / sz[0], H / sz[1], 1.5);
    if (s < 0.35) { s = Math.min(W / sz[0], 0.8); tx = (W - sz[0] * s) / 2; ty = 4; }
    else { tx = (W - sz[0] * s) / 2; ty = Math.max(4, (H - sz[1] * s) / 2); }
    apply(); };
  const zoomAt = (f, cx, cy) => { const ns = Math.min(Math.max(s * f, 0.02), 8); tx = cx - (cx - tx) * ns / s;
    ty = cy - (cy - ty) * ns / s; s = ns; apply(); };
  mk('+', 'zoom in', () => zoomAt(1.25, wrap.clientWidth / 2, wrap.clientHeight / 2));
  mk('−', 'zoom out', () => zoomAt(0.8, wrap.clientWidth / 2, wrap.clientHeight / 2));
  mk('fit', 'fit the whole graph', fit);
  mk('1:1', 'actual size', () => { s = 1; tx = 8; ty = 8; apply(); });
  const center = (g) => { if (!g) return; const ir = inner.getBoundingClientRect(), gr = g.getBoundingClientRect();
    const px = (gr.left + gr.width / 2 - ir.left) / s, py = (gr.top + gr.height / 2 - ir.top) / s;
    if (s < 0.6) s = 0.9;
    tx = wrap.clientWidth / 2 - px * s; ty = wrap.clientHeight / 2 - py * s; apply(); };
  const mark = (recentre) => {
    inner.querySelectorAll('.rv-hl, .rv-sel').forEach((g) => g.classList.remove('rv-hl', 'rv-sel'));
    let first = null;
    for (const id of model.highlight || []) { const g = inner.querySelector(`g#n${id}`);
      if (g) { g.classList.add('rv-hl'); first = first || g; } }
    if (model.selected !== null && model.selected !== undefined) { const g = inner.querySelector(`g#n${model.selected}`);
      if (g) g.classList.add('rv-sel'); }
    if (recentre && first && model.follow) center(first);
  };
  const setSvg = () => { const keep = inner.querySelector('svg') && model.keep_view; inner.innerHTML = model.svg || '';
    const svg = inner.querySelector('svg');
    if (svg) { const vb = svg.viewBox.baseVal; if (vb && vb.width) { svg.setAttribute('width', vb.width);
      svg.setAttribute('height', vb.height); } }
    if (!keep) fit(); mark(true); title.textContent = model.title || ''; };
  let drag = null, moved = false;
  wrap.addEventListener('wheel', (e) => { e.preventDefault(); const r = wrap.getBoundingClientRect();
    zoomAt(e.deltaY < 0 ? 1.15 : 1 / 1.15, e.clientX - r.left, e.clientY - r.top); }, { passive: false });
  wrap.addEventListener('pointerdown', (e) => { drag = [e.clientX, e.clientY, tx, ty]; moved = false; });
  wrap.addEventListener('pointermove', (e) => { if (!drag) return; const dx = e.clientX - drag[0], dy = e.clientY - drag[1];
    if (Math.abs(dx) + Math.abs(dy) > 4) { moved = true; wrap.classList.add('rv-drag'); }
    if (moved) { tx = drag[2] + dx; ty = drag[3] + dy; apply(); } });
  const end = () => { drag = null; wrap.classList.remove('rv-drag'); };
  wrap.addEventListener('pointerup', end); wrap.addEventListener('pointerleave', end);
  wrap.addEventListener('click', (e) => { if (moved) { moved = false; return; }
    const g = e.target.closest('g.node'); if (!g || !/^n\d+$/.test(g.id)) return;
    model.clicked = parseInt(g.id.slice(1)); model.clicks = (model.clicks || 0) + 1; });
  model.on('svg', setSvg); model.on('highlight', () => mark(true)); model.on('selected', () => mark(false));
  model.on('title', () => { title.textContent = model.title || ''; });
  model.on('after_layout', () => { if (!model.keep_view) fit(); mark(true); });
  setSvg();
}
"""  # noqa: E501

_CSS = """
:host { display: flex; flex-direction: column; border: 1px solid #ddd; border-radius: 4px; background: #fff; }
.rv-bar { display: flex; gap: 4px; align-items: center; padding: 3px 6px; border-bottom: 1px solid #eee;
          font: 12px sans-serif; background: #fafafa; }
.rv-title { flex: 1; font-weight: 600; color: #333; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.rv-btn { border: 1px solid #ccc; background: #fff; border-radius: 3px; padding: 0 7px; cursor: pointer; font: 12px sans-serif; }
.rv-wrap { position: relative; overflow: hidden; flex: 1; cursor: grab; min-height: 200px; }
.rv-wrap.rv-drag { cursor: grabbing; }
.rv-inner { position: absolute; left: 0; top: 0; transform-origin: 0 0; }
.rv-inner svg { display: block; }
.rv-inner g.node { cursor: pointer; }
.rv-inner g.node:hover polygon, .rv-inner g.node:hover ellipse, .rv-inner g.node:hover path { stroke-width: 2.5; }
.rv-inner g.rv-hl polygon, .rv-inner g.rv-hl ellipse, .rv-inner g.rv-hl path { stroke: #ff6f00 !important;
          stroke-width: 5 !important; }
.rv-inner g.rv-sel polygon, .rv-inner g.rv-sel ellipse, .rv-inner g.rv-sel path { stroke: #1565c0 !important;
          stroke-width: 4 !important; stroke-dasharray: 5 2; }
"""  # noqa: E501


class SvgGraph(JSComponent):
    """An SVG graph with pan/zoom; `clicked` is the id of the last clicked node.

    Parameters:
        svg: the Graphviz SVG text.
        title: a caption shown above the picture.
        highlight: node ids drawn with a thick orange border (the first is centred when `follow`).
        selected: node id drawn with a dashed blue border.
        clicked: set by the browser when a node is clicked (`clicks` counts clicks, so the same node twice fires).
        keep_view: keep the zoom and pan when the SVG changes (stepping versions) instead of fitting.
    """

    svg = param.String("")
    title = param.String("")
    highlight = param.List(default=[], item_type=int)
    selected = param.Integer(None, allow_None=True)
    clicked = param.Integer(None, allow_None=True)
    clicks = param.Integer(0)
    follow = param.Boolean(True)
    keep_view = param.Boolean(False)

    _esm = _ESM
    _stylesheets = [_CSS]
