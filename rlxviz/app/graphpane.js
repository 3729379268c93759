const BUS = 'rlxviz-view';
export function render({ model, el }) {
  const bar = document.createElement('div'); bar.className = 'rv-bar';
  const title = document.createElement('span'); title.className = 'rv-title';
  const mk = (txt, tip, fn, cls) => { const b = document.createElement('button'); b.textContent = txt; b.title = tip;
    b.className = 'rv-btn' + (cls ? ' ' + cls : ''); b.addEventListener('click', (e) => { e.stopPropagation(); fn(); });
    bar.appendChild(b); return b; };
  bar.appendChild(title);
  const search = document.createElement('input'); search.type = 'search'; search.placeholder = 'find node: op, name, path, role, %id';
  search.className = 'rv-search'; search.title = __SEARCH_KEY__; bar.appendChild(search);
  const found = document.createElement('span'); found.className = 'rv-found'; found.title = __SEARCH_KEY__;
  bar.appendChild(found);
  // the drawing's title (`SvgGraph.caption`) as text over the top of the picture area, the picture fitted below it
  // (`fit`): readable at any zoom, where the graph's own label was 4-5 px high at the fit zoom of a tall layer; it
  // takes no row of its own (the drawing keeps its room, as the label took room inside the picture before), and no
  // pointer: a drag or wheel on it pans or zooms the picture; set as text, never markup (a model's names are data)
  const cap = document.createElement('div'); cap.className = 'rv-caption';
  const capH = () => (model.caption ? cap.offsetHeight : 0);
  const wrap = document.createElement('div'); wrap.className = 'rv-wrap';
  const inner = document.createElement('div'); inner.className = 'rv-inner';
  const mini = document.createElement('div'); mini.className = 'rv-mini'; mini.title = 'overview: click or drag to pan';
  // a labelled head (with the ×) above the picture, so nothing covers it; the picture is at least MINI_MIN_W wide,
  // and a graph too tall for that is cropped to a window that scrolls to keep the visible part in it
  const miniHead = document.createElement('div'); miniHead.className = 'rv-mini-head';
  const miniLabel = document.createElement('span'); miniLabel.className = 'rv-mini-label'; miniLabel.textContent = 'map';
  miniHead.appendChild(miniLabel);
  const miniBody = document.createElement('div'); miniBody.className = 'rv-mini-body';
  const miniImg = document.createElement('img'); miniImg.className = 'rv-mini-img'; miniImg.alt = '';
  miniImg.draggable = false;
  const miniView = document.createElement('div'); miniView.className = 'rv-mini-view';
  miniBody.appendChild(miniImg); miniBody.appendChild(miniView); mini.appendChild(miniHead); mini.appendChild(miniBody);
  // the op colours' legend: folded to a small tag in the picture's lower left corner (no height of its own), its
  // list over the picture when opened
  const ops = document.createElement('details'); ops.className = 'rv-ops';
  ['pointerdown', 'wheel', 'click'].forEach((k) => ops.addEventListener(k, (e) => e.stopPropagation()));
  const setLegend = () => { ops.innerHTML = model.legend || ''; ops.style.display = model.legend ? '' : 'none'; };
  model.on('legend', setLegend); setLegend();
  wrap.appendChild(inner); wrap.appendChild(mini); wrap.appendChild(ops); wrap.appendChild(cap); el.appendChild(bar); el.appendChild(wrap);
  const setCaption = () => { cap.textContent = model.caption || ''; cap.style.display = model.caption ? '' : 'none'; };
  model.on('caption', setCaption); setCaption();
  Object.assign(el.style, { display: 'flex', flexDirection: 'column', width: '100%', height: '100%' });
  let s = 1, tx = 0, ty = 0, touched = false, scope = null;
  // the highlight came with another scope (another model's ids): it marks, never centres, until the next one is set.
  // A path load after ② centred the new model's picture on the old highlight's ids (-1790 px, above the pane), and
  // that centring counted as the user's: every later picture of the model kept the empty view
  let staleMarks = false;
  let aimed = null;  // the key of the search hit the view is centred on (`inView`)
  // the linked panes share one frame: this pane's transform minus `off` (graph units) times the scale. A search or
  // reveal that centres a node sends its id: the partner centres its own node of that id, where it has one, and
  // keeps the difference as its `off`, so later pans and zooms move both without losing the node
  let offX = 0, offY = 0;
  const me = Math.random().toString(36).slice(2);
  let miniUrl = null, mk1 = 1, oy = 0;  // oy: px of the map cropped off above its window
  // the map's box: at most MINI_W x MINI_H, at most MINI_SHARE of the pane's width and height (at 1280x800 with the
  // sidebar open a fixed 170 x 176 box covered ~40% of a pane's drawing), never under MINI_MIN_W x MINI_MIN_H
  const MINI_W = 170, MINI_H = 176, MINI_MIN_W = 96, MINI_MIN_H = 72, MINI_SHARE = 0.25;
  let ox = 0, oyTop = 0;  // px between the map box and its picture (the picture centred in the box)
  const miniSync = () => { const sz = size(); const W = wrap.clientWidth, H = wrap.clientHeight;
    const big = miniOn && sz && W && H && (sz[0] * s > W + 2 || sz[1] * s > H + 2);
    mini.style.display = big ? 'block' : 'none'; miniLater(); if (!big) return;
    const mw = Math.round(Math.min(MINI_W, Math.max(MINI_MIN_W, W * MINI_SHARE)));
    const mh = Math.round(Math.min(MINI_H, Math.max(MINI_MIN_H, H * MINI_SHARE)));
    mk1 = Math.min(mw / sz[0], Math.max(mh / sz[1], MINI_MIN_W / sz[0]));
    const fullH = sz[1] * mk1, winH = Math.min(fullH, mh), cropped = fullH > winH + 1;
    // one box size in every pane of one size (the before and after maps sat at two heights): mw x mh, the picture
    // centred in it
    miniBody.style.width = `${mw}px`; miniBody.style.height = `${mh}px`;  // the head follows
    ox = (mw - sz[0] * mk1) / 2; oyTop = (mh - winH) / 2;
    miniLabel.textContent = cropped ? 'map ↕' : 'map';
    miniHead.title = cropped ? 'overview (the graph is tall: the map shows the part around the view and scrolls '
      + 'with it); click or drag to pan' : 'overview: click or drag to pan';
    const x0 = Math.max(-tx / s, 0), y0 = Math.max(-ty / s, 0);
    const x1 = Math.min((W - tx) / s, sz[0]), y1 = Math.min((H - ty) / s, sz[1]);
    const f0 = y0 * mk1, f1 = Math.max(y1, y0) * mk1;  // the frame's top and bottom on the whole map
    if (f1 - f0 >= winH) oy = f0; else if (f0 < oy) oy = f0; else if (f1 > oy + winH) oy = f1 - winH;
    oy = Math.min(Math.max(oy, 0), fullH - winH);
    Object.assign(miniImg.style, { width: `${sz[0] * mk1}px`, height: `${fullH}px`, left: `${ox}px`,
      top: `${oyTop - oy}px` });
    Object.assign(miniView.style, { left: `${ox + x0 * mk1}px`, top: `${oyTop + f0 - oy}px`,
      width: `${Math.max(x1 - x0, 0) * mk1}px`, height: `${f1 - f0}px` }); };
  // The map's corner: the one where it covers least of the drawing (px² of node boxes, and of cluster outlines
  // weighted up: the left pane's map hid ln2 and the red border of ②'s rejection), summed over the panes that move
  // together (`sync`), so the before and after maps sit alike; a tie keeps the order of CORNERS. Measured once the
  // view rests (MINI_REST_MS), not on every frame of a drag.
  const CORNERS = ['br', 'tr', 'tl', 'bl'], MINI_GAP = 6, MINI_REST_MS = 200, MINI_BUS = 'rlxviz-mini';
  const covers = (window.__rvMiniCovers = window.__rvMiniCovers || {});
  const miniGroup = () => model.sync || me;
  const cornerBox = (c, mw, mh) => { const W = wrap.clientWidth, H = wrap.clientHeight;
    const ops = c === 'bl' && model.legend ? 28 : 0;  // above the folded "op and layer-box colours" tag in that corner
    return [c[1] === 'l' ? MINI_GAP : W - MINI_GAP - mw, c[0] === 't' ? MINI_GAP + capH() : H - MINI_GAP - mh - ops, mw,
      mh]; };
  const overlap = (a, b) => Math.max(0, Math.min(a[0] + a[2], b[0] + b[2]) - Math.max(a[0], b[0]))
    * Math.max(0, Math.min(a[1] + a[3], b[1] + b[3]) - Math.max(a[1], b[1]));
  const coverage = () => { const out = CORNERS.map(() => 0);
    if (mini.style.display === 'none' || !wrap.clientWidth) return out;
    const wr = wrap.getBoundingClientRect(), boxes = CORNERS.map((c) => cornerBox(c, mini.offsetWidth, mini.offsetHeight));
    for (const g of inner.querySelectorAll('g.node, g.cluster')) { const b = g.getBoundingClientRect();
      const r = [b.left - wr.left, b.top - wr.top, b.width, b.height];
      const parts = g.classList.contains('node') ? [[r, 1]] : [[[r[0], r[1], r[2], 3], 8], [[r[0], r[1] + r[3] - 3, r[2], 3], 8],
        [[r[0], r[1], 3, r[3]], 8], [[r[0] + r[2] - 3, r[1], 3, r[3]], 8]];
      boxes.forEach((m, k) => { for (const [x, w] of parts) out[k] += overlap(m, x) * w; }); }
    return out; };
  // a map in the lower left sits above the folded legend where any pane of the group has one: maps alike
  const placeMini = () => { const all = Object.values(covers[miniGroup()] || {});
    const sum = CORNERS.map((_, k) => all.reduce((a, c) => a + c.px[k], 0));
    let best = 0; sum.forEach((v, k) => { if (v < sum[best] - 1) best = k; });
    const c = CORNERS[best], ops = c === 'bl' && all.some((p) => p.legend) ? 28 : 0; mini.dataset.corner = c;
    Object.assign(mini.style, { left: c[1] === 'l' ? `${MINI_GAP}px` : 'auto', right: c[1] === 'r' ? `${MINI_GAP}px` : 'auto',
      top: c[0] === 't' ? `${MINI_GAP + capH()}px` : 'auto', bottom: c[0] === 'b' ? `${MINI_GAP + ops}px` : 'auto' }); };
  const onMiniBus = (e) => { if (e.detail.group === miniGroup()) placeMini(); };
  window.addEventListener(MINI_BUS, onMiniBus);
  let miniTimer = null;
  const miniMeasure = () => { miniTimer = null; const g = miniGroup(); (covers[g] = covers[g] || {})[me] = { px: coverage(), legend: !!model.legend };
    window.dispatchEvent(new CustomEvent(MINI_BUS, { detail: { group: g } })); };
  const miniLater = () => { if (miniTimer) clearTimeout(miniTimer); miniTimer = setTimeout(miniMeasure, MINI_REST_MS); };
  const miniGone = () => { if (miniTimer) clearTimeout(miniTimer); window.removeEventListener(MINI_BUS, onMiniBus);
    const g = covers[miniGroup()]; if (g) { delete g[me];
      window.dispatchEvent(new CustomEvent(MINI_BUS, { detail: { group: miniGroup() } })); } };
  // the wrap's size (px) the view (tx, ty) was set for: a pane that changes size keeps its view's centre (`kept`)
  let setW = 0, setH = 0;
  const apply = (share, node) => { setW = wrap.clientWidth; setH = wrap.clientHeight;
    inner.style.transform = `translate(${tx}px, ${ty}px) scale(${s})`; miniSync();
    if (share && model.sync) window.dispatchEvent(new CustomEvent(BUS, { detail: { group: model.sync, src: me, s,
      tx: tx - offX * s, ty: ty - offY * s, node: node || null, held: node ? held(node) : [] } })); };
  // the ids node `key` of this picture replaced, at any depth (`model.absorbed`): the partner's counterparts of it (a
  // QDQ model's softmax %1871, made by a later pass, stands for the softmax it replaced in the version before)
  const held = (key) => [...new Set(((model.absorbed || {})[key] || []).flatMap((r) => r[1]))];
  // The drawn element that stands for node `id` of the partner's picture: the node, else the fused node that
  // absorbed it (`model.absorbed`), else the folded layer box holding either; with the key of the node it shows
  const standsFor = (id) => { let key = `n${id}`, g = inner.querySelector(`g#${key}`);
    if (!g) { const by = Object.entries(model.absorbed || {}).find(([, rows]) => rows.some((r) => r[1].includes(id)));
      if (by) { key = by[0]; g = inner.querySelector(`g#${key}`); } }
    if (!g) { const n = Number(key.slice(1));
      const box = Object.entries(model.folded || {}).find(([, ns]) => ns.some((x) => x[0] === n));
      if (box) g = inner.querySelector(`g#${CSS.escape(box[0])}`); }
    return g ? { key, g } : null; };
  // The partner centred node `d.node`: this pane centres what stands for it here (a softmax found before fuse_sdpa:
  // the attention that absorbed it, which this pane's search counter then shows when it is one of its hits), else
  // its own search hit, else (a node it has no counterpart of) it is fitted; a pan or zoom it follows. It followed
  // the frame alone: the after pane's hit, named by its note, sat off the pane's edge
  // what stands here for the node the partner centred (`d`, a bus detail): for the node itself, else for one it replaced
  const lead = (d) => standsFor(Number(d.node.slice(1))) || (d.held || []).map((i) => standsFor(i)).find((x) => x) || null;
  // centre `g` in the partner's frame `d` (its zoom), keeping the difference as `off`
  const centreIn = (g, d) => { const ir = inner.getBoundingClientRect(), gr = g.getBoundingClientRect();
    const px = (gr.left + gr.width / 2 - ir.left) / s, py = (gr.top + gr.height / 2 - ir.top) / s;
    s = d.s; tx = seenW() / 2 - px * s; ty = wrap.clientHeight / 2 - py * s;
    offX = (tx - d.tx) / s; offY = (ty - d.ty) / s; };
  // `led`: the partner's centring of a node (its bus detail) this view still follows (no pan, zoom or fit since): the
  // next picture of the same scope is centred on that node again. The before pane's new picture (layer 1 opened by the
  // after pane's Enter) kept the view centred on the old picture's layer box: a white patch of the new one
  let led = null;
  // (a new scope's picture is fitted: `rescope`)
  const follow = () => { if (!led || reveal) return; const d = led, at = lead(d);
    if (at && !inView(at.g)) { centreIn(at.g, d); touched = true; aimed = at.key; apply(false); }
    else if (!at) fit();
    led = d; };
  const onBus = (e) => { const d = e.detail; if (!model.sync || d.group !== model.sync || d.src === me) return;
    led = null; if (d.fit) { fit(); return; }
    const at = d.node ? lead(d) : null;
    if (at) { const k = hits.findIndex((h) => h.key === at.key);
      if (k >= 0) { shown = true; if (k !== hit) { hit = k; last = at.key; found.dataset.hit = at.key; counted(); } } }
    const g = at ? at.g : (d.node && hits.length && hits[hit] ? hits[hit].g : null);
    if (g) centreIn(g, d);
    // a node centred there that this picture neither has nor replaced, and no hit of its own: the partner's frame is
    // in the partner's picture's coordinates, so this picture is fitted. Taking it left the before pane empty white
    // (ernie.qdq's last version, `node_softmax_1`: the after pane's layer 1 centred on its new softmax %1871)
    else if (d.node) { fit(); led = d; return; }
    else { s = d.s; tx = d.tx + offX * s; ty = d.ty + offY * s; }
    touched = true; aimed = at ? at.key : null; led = d.node ? d : null; apply(false); };
  window.addEventListener(BUS, onBus);
  // The pane changed size (the row took the before pane beside it, the search's note took a line): a view the user or
  // a search set keeps its centre, a fitted one is fitted again. It kept its top left corner: a hit centred in the
  // pane at full width lay left of it once the pane was half as wide, and one centred under the bar lay above it
  const kept = () => { const W = wrap.clientWidth, H = wrap.clientHeight;
    if (!W || !H || !setW || !setH || (W === setW && H === setH) || !inner.querySelector('svg')) return;
    if (!touched) { fit(); return; }
    tx += (W - setW) / 2; ty += (H - setH) / 2; apply(false); };
  const resized = new ResizeObserver(kept); resized.observe(wrap);
  const size = () => { const svg = inner.querySelector('svg'); if (!svg) return null;
    const vb = svg.viewBox && svg.viewBox.baseVal; const w = (vb && vb.width) || svg.clientWidth || 1;
    const h = (vb && vb.height) || svg.clientHeight || 1; return [w, h]; };
  // whether the view (zoom and pan) shows some of the picture: a view kept from another picture may show none
  const shows = () => { const sz = size(); if (!sz) return true; const W = wrap.clientWidth, H = wrap.clientHeight;
    return tx < W && tx + sz[0] * s > 0 && ty < H && ty + sz[1] * s > 0; };
  const FIT_PAD = 4;
  const fit = () => { const sz = size(); if (!sz) return; const W = wrap.clientWidth || 600;
    // a tall picture (under 0.35 to fit the whole area) is drawn readable from its top; the caption's height is
    // taken off only once that is decided (it tipped MiniLM's layer, 0.36 whole, into that mode)
    // FIT_PAD px above and below the picture: the margin was added after a scale that filled the height, so a fitted
    // picture's bottom lay 4 px under the pane's edge
    const T = capH(), H0 = wrap.clientHeight || 500, H = Math.max(H0 - T - 2 * FIT_PAD, 100);
    s = Math.min(W / sz[0], H0 / sz[1], 1.5) < 0.35 ? 0 : Math.min(W / sz[0], H / sz[1], 1.5);
    if (!s) { s = Math.min(W / sz[0], 0.8); tx = (W - sz[0] * s) / 2; ty = T + FIT_PAD; }
    else { tx = (W - sz[0] * s) / 2; ty = T + FIT_PAD + Math.max(0, (H - sz[1] * s) / 2); }
    offX = 0; offY = 0; touched = false; aimed = null; apply(false); };
  const moved = () => { touched = true; aimed = null; led = null; apply(true); };
  const zoomAt = (f, cx, cy) => { const ns = Math.min(Math.max(s * f, 0.02), 8); tx = cx - (cx - tx) * ns / s;
    ty = cy - (cy - ty) * ns / s; s = ns; moved(); };
  mk('+', 'zoom in', () => zoomAt(1.25, wrap.clientWidth / 2, wrap.clientHeight / 2), 'rv-zoom-in');
  mk('−', 'zoom out', () => zoomAt(0.8, wrap.clientWidth / 2, wrap.clientHeight / 2), 'rv-zoom-out');
  // "fit" fits every linked pane, each to its own picture: it sent this pane's frame, which the partner took with its
  // own offset (kept from a search's centring), so its picture, of another size, was cut at the pane's right edge
  mk('fit', 'fit the whole graph', () => { led = null; fit();
    if (model.sync) window.dispatchEvent(new CustomEvent(BUS, { detail: { group: model.sync, src: me, fit: true } })); },
  'rv-fit');
  mk('1:1', 'actual size', () => { s = 1; tx = 8; ty = 8; moved(); }, 'rv-one');
  let miniOn = true;
  const setMini = (on) => { miniOn = on; mapBtn.classList.toggle('rv-off', !miniOn); miniSync(); };
  const mapBtn = mk('map', 'show or hide the overview map (shown when the graph is larger than the pane)',
    () => setMini(!miniOn), 'rv-map');
  // the map folds from its own corner too (it lies over the graph's corner): the bar's "map" brings it back
  const miniClose = document.createElement('button'); miniClose.className = 'rv-mini-close'; miniClose.textContent = '×';
  miniClose.title = 'hide the overview map (the "map" button above shows it again)';
  miniClose.addEventListener('pointerdown', (e) => e.stopPropagation());
  miniClose.addEventListener('click', (e) => { e.stopPropagation(); setMini(false); });
  miniHead.appendChild(miniClose);
  // full size: the pane over the whole window (its own bar stays on top), Esc or the button again puts it back
  let full = false;
  // its button says how to close it ("✕ close (Esc)"); the page's header, painted over any pane (its own stacking
  // order), hid the drawing's top and this bar: hidden while full size, with its busy indicator (drawn over the bar)
  const header = () => document.getElementById('header-design-provider') || document.getElementById('header');
  const setFull = (on) => { full = on; el.classList.toggle('rv-full', on); fullBtn.classList.toggle('rv-on', on);
    fullBtn.title = on ? 'back to the page (Esc)' : FULL_TIP; fullBtn.textContent = on ? CLOSE_LABEL : 'full';
    const head = header(), busy = document.getElementById('busy-container'); requestAnimationFrame(() => fit());
    if (head) head.style.visibility = on ? 'hidden' : ''; if (busy) busy.style.display = on ? 'none' : ''; };
  const CLOSE_LABEL = __CLOSE_LABEL__;
  const FULL_TIP = 'full size: this drawing over the whole window (Esc closes it)';
  const fullBtn = mk('full', FULL_TIP, () => setFull(!full), 'rv-full-btn');
  const onKey = (e) => { if (full && e.key === 'Escape') setFull(false); };
  window.addEventListener('keydown', onKey);
  // the width (px) of the pane's part that shows: without its right edge under the node drawer (`model.cover`; the
  // drawer lies under a full-size pane), the whole width where the drawer leaves less than SEEN_MIN_PX. A search hit
  // centred in the whole pane lay under the open drawer, only its ring's left edge showing
  const SEEN_MIN_PX = 40;
  const seenW = () => { const W = wrap.clientWidth, v = W - (full ? 0 : model.cover || 0); return v >= SEEN_MIN_PX ? v : W; };
  const center = (g, share, top) => { if (!g) return; const ir = inner.getBoundingClientRect(), gr = g.getBoundingClientRect();
    const px = (gr.left + gr.width / 2 - ir.left) / s, py = (gr.top + (top ? 0 : gr.height / 2) - ir.top) / s;
    if (s < 0.6) s = 0.9;
    tx = seenW() / 2 - px * s; ty = top ? 24 - py * s : wrap.clientHeight / 2 - py * s; touched = true;
    apply(share, /^n\d+$/.test(g.id) ? g.id : null); };
  const miniPan = (e) => { const r = miniBody.getBoundingClientRect();
    const px = (e.clientX - r.left - ox) / mk1, py = (Math.max(e.clientY - r.top - oyTop, 0) + oy) / mk1;
    tx = seenW() / 2 - px * s; ty = wrap.clientHeight / 2 - py * s; moved(); };
  let miniDrag = false;
  mini.addEventListener('pointerdown', (e) => { e.stopPropagation(); e.preventDefault(); miniDrag = true;
    try { mini.setPointerCapture(e.pointerId); } catch (err) { /* synthetic events have no capture */ } miniPan(e); });
  mini.addEventListener('pointermove', (e) => { e.stopPropagation(); if (miniDrag) miniPan(e); });
  const miniEnd = (e) => { e.stopPropagation(); miniDrag = false; };
  mini.addEventListener('pointerup', miniEnd); mini.addEventListener('pointercancel', miniEnd);
  mini.addEventListener('click', (e) => e.stopPropagation());
  mini.addEventListener('wheel', (e) => { e.stopPropagation(); e.preventDefault(); }, { passive: false });
  const miniPicture = () => { if (miniUrl) URL.revokeObjectURL(miniUrl); miniUrl = null;
    if (!inner.querySelector('svg')) { miniImg.removeAttribute('src'); return; }
    miniUrl = URL.createObjectURL(new Blob([model.svg], { type: 'image/svg+xml' })); miniImg.src = miniUrl; };
  const mark = (recentre) => {
    inner.querySelectorAll('.rv-hl, .rv-sel, .rv-rel').forEach((g) => g.classList.remove('rv-hl', 'rv-sel', 'rv-rel'));
    for (const id of model.related || []) { const g = inner.querySelector(`g#n${id}`); if (g) g.classList.add('rv-rel'); }
    let first = null;
    for (const id of model.highlight || []) { const g = inner.querySelector(`g#n${id}`);
      if (g) { g.classList.add('rv-hl'); first = first || g; } }
    if (model.selected !== null && model.selected !== undefined) { const g = inner.querySelector(`g#n${model.selected}`);
      if (g) g.classList.add('rv-sel'); }
    if (recentre && first && model.follow && !staleMarks) center(first, false);
  };
  let hits = [], hit = -1;
  // A node's own text: the tooltip's first line without its id (op -> shape), its path, its attrs (a name) and the
  // names messages give it (`roles:`, as drawn: `ln1 (role h1)`); `own_text` is this function in Python;
  // not the operands, users or notes, which name other nodes. Layer boxes (and nodes without a tooltip): all.
  const own = (g) => { const a = g.querySelector('a'); const tip = a ? (a.getAttribute('xlink:title') || a.getAttribute('title') || '') : '';
    if (!/^n\d+$/.test(g.id) || !tip) return `${g.textContent} ${tip}`.toLowerCase();
    const lines = tip.split('\n');
    return [lines[0].replace(/^%\d+\s*/, ''), ...lines.slice(1).filter((l) => /^(path|attrs|roles): /.test(l))]
      .join('\n').toLowerCase(); };
  // What a fused node holds at any depth (`model.absorbed`, from `absorbed_index`: [op, ids, note] per op): a query
  // naming one of those ops (or `%id`) finds the fused node after the exact hits, and the count says so ("softmax:
  // absorbed into FusedTransformerLayer %86 (layer 0) via FusedAttentionBlock %40"). null when `g` holds nothing the
  // query names.
  // The ONNX node names of the run's imported nodes (`model.names`, `graphpane.onnx_names`): `named(key, q)` when node
  // `key`'s ONNX node name holds `q` (node_Softmax_144, as the inspector shows it); `nameOf` the name for a note
  const nameOf = (i) => (model.names || {})[`n${i}`] || '';
  const named = (key, q) => !/^%/.test(q) && nameOf(key.slice(1)).toLowerCase().includes(q);
  // a node found by its ONNX node name only ranks with the absorbed hits, its note naming the ONNX node (a QDQ model's
  // `..._Softmax_output_QuantizeLinear` nodes come after the softmax ops for `softmax`)
  const nameNote = (key, q) => (named(key, q) ? `ONNX node ${nameOf(key.slice(1))}` : null);
  const absorbedNote = (key, q) => { const rows = (model.absorbed || {})[key]; if (!rows) return null;
    const id = /^%(\d+)$/.exec(q);
    const byName = (r) => (id ? [] : r[1].filter((i) => named(`n${i}`, q)).map(nameOf));
    const hit = rows.filter((r) => (id ? r[1].includes(Number(id[1])) : (r[0] && r[0].toLowerCase().includes(q))
      || byName(r).length));
    const said = (r) => (id ? [q] : r[0] && r[0].toLowerCase().includes(q) ? [r[0]] : byName(r).map((n) => `${n} (${r[0]})`));
    const by = new Map(); for (const r of hit) by.set(r[2], new Set([...(by.get(r[2]) || []), ...said(r)]));
    return hit.length ? [...by].map(([note, ops]) => `${[...ops].join(', ')}: ${note}`).join('; ') : null; };
  // A hit: {key, g, note}. `key` names the node the hit is (`n<id>`, drawn or inside a folded box), `g` the drawn
  // element that shows it (the node, or the folded layer's box that holds it), `note` the absorbed note or ''.
  // Every node inside a folded box is a hit of its own, so the hits and their order (`model.order`, the graph's
  // node order; exact hits first, then fused nodes that absorbed a match) are the same whichever layers are open.
  let last = null, lastQ = null;  // the key of the hit the counter shows, for the query it was found with
  // whether the counter's hit was shown (Enter, or the partner pane centring it): the next Enter steps on from it;
  // until then Enter shows it (opening its folded layer). Typing centres the first hit but leaves this false: the
  // first Enter after a new query stepped past hit 1 (typed "softmax", then Enter, read "2/6")
  let shown = false;
  // `aimed`: the key of the hit the search centred, while the view is still that centring (no pan, zoom or fit
  // since): a new picture of the same scope keeps the view, and the search's hit there, when that view does not show
  // it, is centred. A query typed while version 26's picture was on its way centred its hit in version 0's picture;
  // version 26's drew its own hit 900 px above the pane, and the counter named that one
  const inView = (g) => { const wr = wrap.getBoundingClientRect(), gr = g.getBoundingClientRect();
    return gr.left >= wr.left && gr.right <= wr.left + seenW() && gr.top >= wr.top && gr.bottom <= wr.bottom; };
  const absentNote = (q) => { const id = /^%(\d+)$/.exec(q), where = id && (model.absent || {})[`n${id[1]}`];
    return where ? `${q} is not in this version (${where})` : ''; };
  const counted = () => { const n = hits[hit].note || ''; found.textContent = `${hit + 1}/${hits.length}`;
    foundNote.textContent = n; foundNote.style.display = n ? 'block' : 'none'; };
  // the note is a line of its own between the bar and the picture, shown while it says something (in the bar it
  // wrapped the bar's buttons; over the picture's top it covered the drawing's title, in full view too)
  const foundNote = document.createElement('div'); foundNote.className = 'rv-found-note'; el.insertBefore(foundNote, wrap);
  // A box of the layer view (`g.node#layerN`, `g.node#g_embeddings`) holds hits when nodes inside it match:
  // `model.folded` lists them ({layerN: [[id, own text], ...]}); Enter on such a hit opens the layer, and the
  // node is centred once the layer is drawn.
  const folded = (q) => { const id = /^%(\d+)$/.exec(q);  // a node of a box's list: [id, own text]
    return id ? (n) => n[0] === Number(id[1]) : (n) => n[1].includes(q); };
  // a folded node whose match is only in the ops it absorbed ranks with the absorbed hits, as it does drawn
  const ownFolded = (q) => (n) => n[1].split('\nabsorbed ops: ')[0].includes(q);
  const matches = (q) => { const id = /^%(\d+)$/.exec(q);  // %37: that node only, not %370 nor its users
    return id ? (g) => g.id === `n${id[1]}` : (g) => own(g).includes(q); };
  // A layer's box (or its cluster, drawn open): `layer3`, or `layer_decoder_0` in an encoder-decoder model (the stack
  // may hold `.` and `_`); its id goes to Python whole (`viz.box_layer`): the index alone could not tell encoder
  // layer 0 from decoder layer 0, and `layer_decoder_0` gave NaN, so the click opened nothing.
  const isBox = (id) => /^layer(\d+|_.+_\d+)$/.test(id);
  // `ids`: the hits inside the box, centred once the layer is drawn open (the layer's top was centred, the node
  // often below the pane)
  const open = (g, ids) => { reveal = g.id; revealIds = ids || []; model.layer_clicked = g.id;  // viz.box_layer reads it
    model.layer_clicks = (model.layer_clicks || 0) + 1; };
  const collect = (q) => { const all = [...inner.querySelectorAll('g.node')], exact = [], deep = [];
    const test = folded(q), mine = ownFolded(q), isId = /^%\d+$/.test(q), match = matches(q);
    for (const g of all) {
      if (!/^n\d+$/.test(g.id) && (model.folded || {})[g.id]) {
        for (const n of model.folded[g.id]) { const h = { key: `n${n[0]}`, g, note: '', id: n[0] };
          if (test(n) && (isId || mine(n))) exact.push(h);
          else if ((h.note = absorbedNote(h.key, q) || nameNote(h.key, q) || '') || test(n)) deep.push(h); }
        continue; }
      if (match(g)) { exact.push({ key: g.id, g, note: '', id: /^n\d+$/.test(g.id) ? Number(g.id.slice(1)) : null }); continue; }
      const note = absorbedNote(g.id, q) || nameNote(g.id, q);
      if (note) deep.push({ key: g.id, g, note, id: /^n\d+$/.test(g.id) ? Number(g.id.slice(1)) : null }); }
    const rank = new Map((model.order || []).map((i, k) => [i, k]));
    const pos = (h) => (h.id !== null && rank.has(h.id) ? rank.get(h.id) : Infinity);
    const sorted = (xs) => xs.map((h, k) => [h, k]).sort((a, b) => (pos(a[0]) - pos(b[0])) || (a[1] - b[1])).map((x) => x[0]);
    // a folded fused node whose own text also matched is listed once (exact), as it is once it is drawn
    const seen = new Set(); return [...sorted(exact), ...sorted(deep)].filter((h) => !seen.has(h.key) && seen.add(h.key)); };
  // how: 'type' (the query was typed: its first hit, or the same query's hit, is centred), 'step' (Enter: the hit
  // the counter names when it was not shown yet, else the next one, centred, its folded layer opened) or 'again' (a
  // new picture, a new index, a term carried to another model: the hits are marked and counted, the view stays; the
  // same query resumes at the hit it showed: a re-render after opening a layer kept no place, Enter went round in
  // circles). It centred on every new picture: a term carried to another model zoomed both panes onto its hit.
  const find = (how) => { inner.querySelectorAll('.rv-found-node').forEach((g) => g.classList.remove('rv-found-node'));
    foundNote.style.display = 'none'; found.classList.remove('rv-hits');
    const q = search.value.trim().toLowerCase();
    if (!q) { hits = []; last = lastQ = null; shown = false; found.textContent = ''; return; }
    const step = how === 'step';
    if (!step || !hits.length) { hits = collect(q);
      hit = q === lastQ && last !== null ? hits.findIndex((h) => h.key === last) : -1;
      if (hit < 0) { hit = 0; shown = false; } }
    lastQ = q;
    hits.forEach((h) => h.g.classList.add('rv-found-node'));
    // a `%id` of another version of the run says where it is (`absent_note`): the CLI and the Why tab name ids of any
    // version, and `%324` on version 0 read only "no match"
    if (!hits.length) { last = null; shown = false; found.textContent = 'no match'; const away = absentNote(q);
      foundNote.textContent = away; foundNote.style.display = away ? 'block' : 'none'; return; }
    found.classList.add('rv-hits');  // the mark's swatch before the count: the search's legend
    if (step && shown) hit = (hit + 1) % hits.length;
    const h = hits[hit]; last = h.key; found.dataset.hit = h.key; counted();  // data-hit: the node shown
    if (step) { shown = true; center(h.g, true); if (h.g.id !== h.key && isBox(h.g.id) && h.id !== null) open(h.g, [h.id]); }
    else if (how === 'type') center(h.g, true);
    if (step || how === 'type') aimed = h.key; };
  // A picture of another model (its scope's model part differs, `ZoomScope`; '' or none: not known): a node-id
  // query (`%795`, `NODE_QUERY`) named a node of the model before, so it is cleared (it read "%795 — no match" on
  // the new model); a term ("softmax") carries over on purpose. `graphpane.kept_query` says the same in Python.
  const modelOf = (sc) => (sc || '').split(':')[0];
  const otherModel = (a, b) => !!modelOf(a) && !!modelOf(b) && modelOf(a) !== modelOf(b);
  const keptQuery = (q, other) => (other && /^\s*%/.test(q) ? '' : q);
  // another model's node keys (`n12`) are not this one's: a carried term starts at its first hit, not shown yet
  const rebase = (was) => { const other = otherModel(was, model.scope), q = keptQuery(search.value, other);
    if (other) { hits = []; last = null; shown = false; }
    if (q === search.value) return; search.value = q; hits = []; last = lastQ = null; find('again'); };
  search.addEventListener('input', () => find('type'));
  search.addEventListener('keydown', (e) => { e.stopPropagation(); if (e.key === 'Enter') find('step'); });
  let reveal = null, revealIds = [];
  // no scope ('') is no promise that the next picture is the same graph's: it is fitted
  const setSvg = () => { if (otherModel(scope, model.scope)) led = null;  // another model's ids
    const had = inner.querySelector('svg'); const same = had && !!model.scope && scope === model.scope;
    if (scope !== null && scope !== model.scope) staleMarks = true;  // another model's: its marks are stale
    rebase(scope); inner.innerHTML = model.svg || ''; scope = model.scope;
    const svg = inner.querySelector('svg');
    if (svg) { const vb = svg.viewBox.baseVal; if (vb && vb.width) { svg.setAttribute('width', vb.width);
      svg.setAttribute('height', vb.height); } }
    miniPicture();
    const keep = same && touched && shows();  // a kept view that shows none of the picture is no view: fitted
    if (!keep) fit(); else apply(false);
    mark(!keep); hits = []; if (search.value) find('again');
    const h = hits[hit]; if (keep && !reveal && aimed && h && !inView(h.g)) { center(h.g, false); aimed = h.key; }
    // the partner's centred node, still followed: centred again in this picture where it stands here, else fitted
    else if (keep && !(h && aimed)) follow();
    title.textContent = title.title = model.title || '';
    if (reveal) { const g = inner.querySelector(`g#${CSS.escape(reveal)}`); const ids = revealIds; reveal = null; revealIds = [];
      const node = ids.map((i) => inner.querySelector(`g#n${i}`)).find((x) => x);
      if (node) { center(node, true); aimed = last; }  // the search resumed at this hit (`last`)
      else if (g) center(g, true, g.classList.contains('cluster')); } };
  let drag = null, dragged = false;
  wrap.addEventListener('wheel', (e) => { e.preventDefault(); const r = wrap.getBoundingClientRect();
    zoomAt(e.deltaY < 0 ? 1.15 : 1 / 1.15, e.clientX - r.left, e.clientY - r.top); }, { passive: false });
  wrap.addEventListener('pointerdown', (e) => { drag = [e.clientX, e.clientY, tx, ty]; dragged = false; });
  wrap.addEventListener('pointermove', (e) => { if (!drag) return; const dx = e.clientX - drag[0], dy = e.clientY - drag[1];
    if (Math.abs(dx) + Math.abs(dy) > 4) { dragged = true; wrap.classList.add('rv-drag'); }
    if (dragged) { tx = drag[2] + dx; ty = drag[3] + dy; moved(); } });
  const end = () => { drag = null; wrap.classList.remove('rv-drag'); };
  wrap.addEventListener('pointerup', end); wrap.addEventListener('pointerleave', end);
  wrap.addEventListener('click', (e) => { if (dragged) { dragged = false; return; }
    const g = e.target.closest('g.node') || e.target.closest('g.cluster'); if (!g) return;
    if (/^n\d+$/.test(g.id)) { model.clicked = parseInt(g.id.slice(1)); model.clicks = (model.clicks || 0) + 1; }
    else if (isBox(g.id)) open(g); });
  // a new scope fits the picture whichever comes first: a patch that sets svg and scope together hands them over one
  // at a time, svg first, so `setSvg` saw the old scope and kept the last model's zoom (an empty view)
  const rescope = () => { if (model.scope === scope) return; if (otherModel(scope, model.scope)) led = null;
    staleMarks = scope !== null; rebase(scope); scope = model.scope;
    if (inner.querySelector('svg')) { fit(); mark(false); if (search.value) find('again'); } else touched = false; };
  model.on('svg', setSvg); model.on('scope', rescope);
  // another model's index can arrive after its picture (setSvg searched the new picture with the old index: a
  // kept "softmax" read "no match" on minilm until retyped): search again with it
  const research = () => { hits = []; if (search.value) find('again'); };
  model.on('absorbed', research); model.on('folded', research); model.on('names', research); model.on('order', research);
  model.on('absent', research);
  model.on('highlight', () => { staleMarks = false; mark(true); }); model.on('selected', () => mark(false));
  model.on('related', () => mark(false));
  model.on('title', () => { title.textContent = title.title = model.title || ''; });
  model.on('after_layout', () => { if (!touched) fit(); else miniSync(); mark(!touched); });
  model.on('remove', () => { if (full) setFull(false); miniGone(); window.removeEventListener(BUS, onBus); resized.disconnect(); window.removeEventListener('keydown', onKey); if (miniUrl) URL.revokeObjectURL(miniUrl); });
  setSvg();
}
