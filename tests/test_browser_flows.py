"""The lecturer's and the engineer's flows in a real browser, at a laptop's 1280x800 and at 1920x1080.

Lecturer: the page opens on "start here"; its three clicks step to the first pass (both panes at least 560 px
wide), break layer 1 (the banner names the guard) and open the Why tab on it. Engineer: a node fused away is
selected in the before pane and the after pane marks what it became; a matmul's weights are in the node panel;
the IR tab compares two versions side by side; a download is named after the model and version; a dragged and
dropped .onnx file loads. Every page is watched (tests/served.py): no console error, no request off the
machine. Screenshots go to test-artifacts/flow-*.png (docs/img/ holds copies; the README's first picture,
docs/img/app-start-1280x800.png, is flow-step-1280x800.png: `pytest tests/test_browser_flows.py -k "lecturer and
1280"`, then copy it).
"""

import base64
import re

import pytest
from playwright.sync_api import expect
from served import (
    ART,
    ROOT,
    WAIT_MS,
    browser_fixture,
    choose_version,
    close_inspector,
    open_tab,
    shared_server_fixture,
    watched_page,
)

expect.set_options(timeout=WAIT_MS)


server = shared_server_fixture()
browser = browser_fixture()


DROP_JS = """([b64, name]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const dt = new DataTransfer(); dt.items.add(new File([bytes], name));
  const find = (root) => { const el = root.querySelector('.rv-drop .filepond--drop-label, .filepond--drop-label');
    if (el) return el;
    for (const e of root.querySelectorAll('*')) if (e.shadowRoot) { const f = find(e.shadowRoot); if (f) return f; }
    return null; };
  const target = find(document); const r = target.getBoundingClientRect();
  const opts = { dataTransfer: dt, bubbles: true, cancelable: true, composed: true,
                 clientX: r.x + r.width / 2, clientY: r.y + r.height / 2 };
  for (const t of ['dragenter', 'dragover', 'drop']) target.dispatchEvent(new DragEvent(t, opts));
}"""
"""A file dragged onto the start strip's drop zone and let go: the browser's dragenter, dragover and drop events
with the file in their DataTransfer, as a real drag sends them (the drop zone lives in a shadow root)."""


def _text(pg, css):
    """The text of a Panel pane (its content lies in a shadow root, which text_content of the host leaves out)."""
    return pg.locator(f"{css} div").first.text_content()


@pytest.mark.parametrize("width,height", [(1280, 800), (1920, 1080)])
def test_lecturer_flow_start_here(browser, server, width, height):
    with watched_page(browser, server[0], width, height) as pg:
        strip = pg.locator(".rv-start")
        expect(strip).to_be_visible()
        assert strip.bounding_box()["height"] <= 110  # the graph keeps the room
        pg.screenshot(path=str(ART / f"flow-start-{width}x{height}.png"))
        pg.locator(".rv-start-step button").click()  # ① the first pass
        expect(pg.locator(".rv-before .rv-title")).to_have_text(re.compile(r"^before "))
        pg.locator(".rv-before g.node").first.wait_for()
        panes = [pg.locator(p).bounding_box() for p in (".rv-before", ".rv-after")]
        assert all(p["width"] >= 560 for p in panes), panes
        expect(pg.locator(".rv-start-note")).to_contain_text("Showing after")
        pg.wait_for_timeout(300)  # the panes' fit after the new picture
        pg.screenshot(path=str(ART / f"flow-step-{width}x{height}.png"))
        pg.locator(".rv-start-break button").click()  # ② break layer 1
        expect(pg.locator(".rv-message")).to_contain_text("layer 1 NOT fused")
        expect(pg.locator(".rv-message")).to_contain_text("guard")
        # the panes step to the pass that refused it (h1_user_count of fuse_transformer_layer)
        expect(pg.locator(".rv-version select option:checked")).to_contain_text("after fuse_transformer_layer")
        pg.locator(".rv-start-why button").click()  # ③ ask why
        expect(pg.locator(".bk-tab.bk-active")).to_have_text(re.compile("Why"))
        expect(pg.locator(".rv-why")).to_contain_text("Layer 1")
        expect(pg.locator(".rv-why")).to_contain_text("first rejection")
        pg.locator(".rv-why-graph g.node").first.wait_for()
        pg.screenshot(path=str(ART / f"flow-why-{width}x{height}.png"))


def test_engineer_flow_sync_weights_diff_download_drop(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        choose_version(pg, "after fuse_attention_block")
        pg.locator(".rv-before g.node").first.wait_for()
        before = pg.locator(".rv-before g.node[id^=n]").evaluate_all("els => els.map(e => e.id)")
        after = set(pg.locator(".rv-after g.node[id^=n]").evaluate_all("els => els.map(e => e.id)"))
        gone = next(i for i in before if i not in after)  # a node the pass fused away
        search = pg.locator(".rv-before .rv-search")
        search.fill("%" + gone[1:])
        search.press("Enter")  # centres it
        pg.locator(f".rv-before g#{gone}").click()
        expect(pg.locator(".rv-inspector")).to_contain_text("became")
        became = re.search(r"became %(\d+)", _text(pg, ".rv-inspector")).group(1)
        pg.locator(f".rv-after g#n{became}.rv-rel").wait_for()  # the after pane marks what it became
        pg.screenshot(path=str(ART / "flow-sync.png"))
        close_inspector(pg)
        search.fill("matmul")
        search.press("Enter")
        # (the hits, in page order, now hold the fused nodes that absorbed a matmul too: this one may lie under the
        # header, so the click is dispatched, as for the after pane below)
        pg.locator(".rv-before g.rv-found-node").nth(1).dispatch_event("click")
        expect(pg.locator(".rv-inspector")).to_contain_text("weights")
        expect(pg.locator(".rv-inspector")).to_contain_text(re.compile(r"min -?\d.*max -?\d.*mean"))
        close_inspector(pg)

        open_tab(pg, "IR & diff")
        pg.locator(".rv-sbs").wait_for()
        assert pg.locator(".rv-sbs tr.rv-sbs-replace, .rv-sbs tr.rv-sbs-insert, .rv-sbs tr.rv-sbs-delete").count()
        left = pg.locator(".rv-diff-left select")
        left.select_option(left.locator("option").first.get_attribute("value"))  # the input vs this version
        expect(pg.locator(".rv-sbs th").nth(1)).to_have_text("input")
        with pg.expect_download() as got:
            pg.locator(".bk-btn", has_text="SVG").first.click()
        assert got.value.suggested_filename == "minilm.after-fuse_attention_block.svg", got.value.suggested_filename

        open_tab(pg, "Graph")
        expect(pg.locator(".rv-drop")).to_be_visible()  # the strip shows on the Graph tab again (not on IR & diff)
        pg.wait_for_timeout(300)
        pg.evaluate(DROP_JS, [base64.b64encode((ROOT / "tests/fixtures/onnx/gpt2.onnx").read_bytes()).decode(),
                              "gpt2.onnx"])
        expect(pg.locator(".rv-message")).to_contain_text("equals the ONNX model", timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-version select")).to_contain_text("input")
        pg.screenshot(path=str(ART / "flow-dropped.png"))
        # the inspector names the ONNX node a node came from, its op type and domain (to find it in Netron)
        expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)
        choose_version(pg, "input")  # the input graph, as read from the file
        search = pg.locator(".rv-after .rv-search")
        search.fill("matmul")
        search.press("Enter")
        pg.locator(".rv-after g.rv-found-node[id^='n']").first.dispatch_event("click")  # (it may lie under the tabs)
        # its name, op type and domain as the file has them (gpt2's matmul came from a Gemm, node_addmm)
        expect(pg.locator(".rv-inspector")).to_contain_text(re.compile(r"ONNX node node_\w+ \((Gemm|MatMul)\), "
                                                                       r"domain ai\.onnx"))
        close_inspector(pg)


@pytest.mark.parametrize("kind,label,unit", [("time share", "time: ", "% of the per-node time"),
                                             ("error vs input", "error vs version 0's reference: ",
                                              "max |value - reference of version 0|")])
def test_engineer_colours_nodes_by_time_share_and_error(browser, server, kind, label, unit):
    """The overlay selector: the after pane's nodes take the palette's fills, each tooltip gives the node's figure,
    the legend names the unit; back to "op" the op colours return. Screenshot test-artifacts/flow-overlay-*.png."""
    with watched_page(browser, server[0], 1280, 800) as pg:
        choose_version(pg, "after fuse_attention_block")
        pg.locator(".rv-after g.node").first.wait_for()
        pg.locator(".rv-overlay select").select_option(label=kind)
        expect(pg.locator(".rv-legend")).to_contain_text(unit, timeout=3 * WAIT_MS)
        tips = _tips(pg, label)
        assert tips, "no node tooltip names its figure"
        fills = pg.locator(".rv-after g.node path, .rv-after g.node polygon").evaluate_all(
            "ps => ps.map((p) => p.getAttribute('fill'))")
        assert {"#ffffb2", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#b10026"} & set(fills), fills
        pg.wait_for_timeout(300)
        pg.screenshot(path=str(ART / f"flow-overlay-{kind.split()[0]}-1280x800.png"))
        pg.locator(".rv-overlay select").select_option(label="op (no overlay)")
        for _ in range(120):
            if not _tips(pg, label, wait=False):
                break
            pg.wait_for_timeout(250)
        assert not _tips(pg, label, wait=False)


def _tips(pg, label, wait=True):
    """The after pane's node tooltips (Graphviz writes them as the xlink:title of each node's link) that hold
    `label`; with `wait`, polled until one does (the figures are measured in the timing process)."""
    js = ("as => as.map((a) => a.getAttribute('xlink:title') || a.getAttributeNS('http://www.w3.org/1999/xlink', "
          "'title') || '')")
    for _ in range(240 if wait else 1):
        got = [t for t in pg.locator(".rv-after g.node a").evaluate_all(js) if label in t]
        if got or not wait:
            return got
        pg.wait_for_timeout(250)
    return []
