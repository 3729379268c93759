"""`IRText`: a graph's IR text in the browser with line numbers, linked to the graph by node id.

A line that defines a node (`%12 = ...`) carries the id: clicking the line sets `clicked` (and bumps
`clicks`), and `selected` marks its line and scrolls it into view. Text is set with `textContent`, never as
markup (text from a model is data).
"""

from __future__ import annotations

import param
from panel.custom import JSComponent

_ESM = r"""
export function render({ model, el }) {
  const box = document.createElement('div'); box.className = 'rv-irbox'; el.appendChild(box);
  const draw = () => { box.replaceChildren(); const lines = (model.text || '').split('\n');
    lines.forEach((line, k) => { const row = document.createElement('div'); row.className = 'rv-irline';
      const no = document.createElement('span'); no.className = 'rv-irno'; no.textContent = String(k + 1);
      const code = document.createElement('span'); code.className = 'rv-ircode'; code.textContent = line;
      row.appendChild(no); row.appendChild(code);
      const m = /^\s*%(\d+)\s*=/.exec(line); if (m) { row.dataset.id = m[1]; row.classList.add('rv-irnode'); }
      box.appendChild(row); });
    mark(); };
  const mark = () => { box.querySelectorAll('.rv-irsel').forEach((r) => r.classList.remove('rv-irsel'));
    if (model.selected === null || model.selected === undefined) return;
    const row = box.querySelector(`[data-id="${model.selected}"]`);
    if (row) { row.classList.add('rv-irsel'); row.scrollIntoView({ block: 'center' }); } };
  box.addEventListener('click', (e) => { const row = e.target.closest('.rv-irnode'); if (!row) return;
    model.clicked = parseInt(row.dataset.id); model.clicks = (model.clicks || 0) + 1; });
  model.on('text', draw); model.on('selected', mark);
  draw();
}
"""

_CSS = """
:host { display: block; }
.rv-irbox { font: 12px ui-monospace, 'DejaVu Sans Mono', monospace; max-height: 600px; overflow: auto;
            border: 1px solid #eee; background: #fcfcfc; white-space: pre; }
.rv-irline { display: flex; }
.rv-irno { color: #999; min-width: 3.5em; text-align: right; padding-right: 8px; user-select: none;
           border-right: 1px solid #eee; margin-right: 6px; }
.rv-irnode { cursor: pointer; }
.rv-irnode:hover { background: #eef4fb; }
.rv-irsel { background: #fff3c4 !important; outline: 1px solid #f0c000; }
"""


class IRText(JSComponent):
    """IR text with line numbers; `selected` (a node id) marks and scrolls to its line; a click on a node's
    line sets `clicked` (`clicks` counts clicks)."""

    text = param.String("")
    selected = param.Integer(None, allow_None=True)
    clicked = param.Integer(None, allow_None=True)
    clicks = param.Integer(0)

    _esm = _ESM
    _stylesheets = [_CSS]
