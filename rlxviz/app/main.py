"""The Panel app's template: one `AppState` per browser session, the views placed in a template.

`app.py` calls `build_app().servable()`; `panel serve app.py` runs it (see the Makefile's `app` target).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import panel as pn
from panel.theme.fast import Fast
from panel.viewable import Viewer

from ..session.isolated import spare_ready, stop_children
from .access import refusal
from .controls import ModelControls, PipelineControls, VariantControls
from .jobs import Runner
from .layout import ConnectionNotice, FoldSidebar, fold_for_drawer, follow_editor
from .panels import IRView, VersionStepper, graph_tab
from .sources import remove_stale_uploads, remove_uploads
from .start import StartHere
from .state import AppState
from .statusbar import StatusBar
from .step import frozen_step
from .text import md_escape
from .timingview import TimingView
from .whyview import DecisionTable, WhyView

WHY_TAB = 2
"""Index of the "Why didn't layer N fuse?" tab (the start strip's third click opens it)."""
TITLE = "rlxviz: why did (or didn't) it fuse?"
MAIN_CSS = (".main .card-margin { margin-top: 4px; margin-bottom: 2px; } "
            ".main .card-margin.stretch_both, .main .card-margin.stretch_height { height: calc(100% - 6px); }")
"""The main area's own margins: the template's 16 px above and below it took 32 px of the graph's height at 800 px
(issue 39: 450 px of graph at 1280x800, with the message banner shown)."""
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
"""Fonts the machine has: the page loads nothing from outside the server it came from."""


class LocalFast(Fast):
    """Panel's Fast design without its Google Fonts stylesheet (`https://fonts.googleapis.com/...`), so the page
    makes no request beyond the local server: everything else Panel and Bokeh need is served from `/static`."""

    _resources = {**Fast._resources, "font": {}}


# Panel resolves a design's bundled files under its lower-cased class name (`bundled/fast/js/fast_design.js`).
LocalFast.__name__ = "Fast"


def serve_css_locally() -> None:
    """Keep every stylesheet on the local server.

    Panel points a component's stylesheet URLs (`css/loading.css`, `css/markdown.css`) at its CDN
    (`panel.io.resources.CDN_DIST`) whenever the component's document has no `dist_url` template variable, which
    happens for components created or updated after the page's first render (a click that swaps a pane): the
    browser then fetched those files from cdn.holoviz.org. When Panel serves its resources itself (`use_cdn()` is
    False, as under `panel serve`), this points them at the server's `/static` copy instead. Idempotent.
    """
    from panel import reactive
    from panel.io import resources

    if getattr(resources.patch_stylesheet, "rlxviz_local", False):
        return
    original = resources.patch_stylesheet

    def patch(stylesheet: object, dist_url: str) -> None:
        if dist_url == resources.CDN_DIST and not resources.use_cdn():
            dist_url = resources.get_dist_path(cdn=False)
        original(stylesheet, dist_url)

    patch.rlxviz_local = True  # type: ignore[attr-defined]
    resources.patch_stylesheet = patch
    reactive.patch_stylesheet = patch  # imported by name there


def no_mathjax() -> None:
    """Leave MathJax out of every page: no text of the app is math, and model text is shown as text.

    Panel adds Bokeh's MathJax bundle (`bokeh-mathjax.min.js`, 1.8 MB, the page's largest script) to any page
    with a Markdown or HTML pane, in case one holds TeX, and with it loaded a pane typesets any `$$...$$`,
    `\\(...\\)` or `\\[...\\]` in its text, which `text.md_escape` leaves as written. Without the bundle,
    Panel's panes find no TeX provider and show their text unchanged, and each page parses 1.8 MB less
    JavaScript (every session's browser pays it). A page that asks for MathJax (`pn.extension('mathjax')`, e.g. a
    notebook) still gets it. Idempotent.
    """
    from panel.io import resources

    if getattr(resources._panel_use_mathjax, "rlxviz_off", False):
        return

    def never(roots: object) -> bool:
        return False

    never.rlxviz_off = True  # type: ignore[attr-defined]
    resources._panel_use_mathjax = never


_SERVER_READY = threading.Event()


def server_start() -> None:
    """Once per server process: remove the upload folders a killed server left (`remove_stale_uploads`) and
    make SIGTERM stop the server within a moment (`stop_on_sigterm`)."""
    if _SERVER_READY.is_set():
        return
    _SERVER_READY.set()
    remove_stale_uploads()
    stop_on_sigterm()


def stop_on_sigterm() -> None:
    """Install the SIGTERM handler (main thread only; elsewhere nothing): every child process killed (loads,
    timings, overlays: `session.isolated.stop_children`), this server's upload folders removed, then the process
    exits with 143 (128 + SIGTERM) at once. Waiting for the job threads instead could take a job's whole time
    limit: a stopping server keeps nothing a session made."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: object) -> None:
        stop_children()
        remove_uploads()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def build_app(state: AppState | None = None) -> pn.template.BaseTemplate:
    """The app for one session.

    Args:
        state: an existing state (tests, notebooks); default a new one that shows the run another session
            already made of the default settings (`AppState.start_cached`), else loads the model in the
            background once the page is shown, so the page appears at once.

    Returns:
        A `FastListTemplate`; call `.servable()` on it.
    """
    if _client_address() is not False:  # a served page (not a test or a notebook): this process is the server
        server_start()
    serve_css_locally()
    no_mathjax()
    pn.extension("tabulator", "codeeditor", "filedropper", notifications=False, sizing_mode="stretch_width")
    refused = _refusal()
    if refused is not None:  # before any state, model or file is touched
        page = pn.template.FastListTemplate(title=TITLE, design=LocalFast, font=FONT, font_url="", theme_toggle=False,
                                            header_background="#0d47a1",
                                            main=[pn.pane.Alert(md_escape(refused), alert_type="danger",
                                                                css_classes=["rv-refused"])])
        page.state = None  # type: ignore[attr-defined]
        return page
    if state is None:
        if _warm_up_session():  # server start (`panel serve --warm`): the first upload need not wait for a cold child
            threading.Thread(target=spare_ready, name="rlxviz-spare-loader", daemon=True).start()
        state = AppState(runner=Runner(background=True, page=_page_thread()), autorun=False)
        if state.start_cached():  # a run of these settings is done (`panel serve --warm`): the page shows it
            pass
        elif pn.state.curdoc is not None and pn.state.curdoc.session_context is not None:
            pn.state.onload(lambda: _start(state))
        else:
            _start(state)
    model = ModelControls(state=state)
    tabs = pn.Tabs(
        ("Graph", graph_tab(state)),
        ("Matches & rejections", _when_shown(lambda: DecisionTable(state=state))),
        ("Why didn't layer N fuse?", _when_shown(lambda: WhyView(state=state))),
        ("Timing", _when_shown(lambda: TimingView(state=state))),
        ("IR & diff", _when_shown(lambda: IRView(state=state))),
        ("IR editor", model.editor()),
        dynamic=True, sizing_mode="stretch_both", css_classes=["rv-tabs"])
    follow_editor(tabs, len(tabs) - 1, model, state, model.ir_btn)
    start = StartHere(state=state, show_why=lambda: setattr(tabs, "active", WHY_TAB), dropper=model.make_dropper())
    tabs.param.watch(lambda e: start.show_on(e.new in (0, WHY_TAB)), "active")
    stepper = VersionStepper(state=state)
    # the ops-per-version chips wrap (two lines at 1280 px); the IR editor, which edits the input, gets their height
    editor_tab = len(tabs) - 1
    tabs.param.watch(lambda e: setattr(stepper.counts, "visible", e.new != editor_tab), "active")
    fold = FoldSidebar()
    fold_for_drawer(fold, state)
    tmpl = pn.template.FastListTemplate(
        title=TITLE, sidebar_width=340, accent="#1565c0", header_background="#0d47a1", theme_toggle=False,
        main_layout=None,  # no card round the main area: its margins took 30 px of the graph's height at 800 px
        design=LocalFast, font=FONT, font_url="", raw_css=[MAIN_CSS],
        sidebar=[model, VariantControls(state=state), PipelineControls(state=state)],
        header=[fold, start.back, ConnectionNotice()],
        main=[pn.Column(start, StatusBar(state=state), stepper, tabs, sizing_mode="stretch_both")])
    tmpl.state = state  # type: ignore[attr-defined]  # handy for tests and notebooks
    return tmpl


def _page_thread() -> tuple[Callable[[Callable[[], None]], None], Callable[[], bool]] | None:
    """For `Runner(page=...)`: run a job's state changes on this session's thread, the one that builds the app
    (None outside a server session), each as one `frozen_step`. Panel objects changed from the job's thread send
    their patches by a second route that can overtake this thread's, so the browser got a patch naming a model
    before the patch that defines it ("reference p2505 isn't known", a console error; see `jobs.Runner.on_page`)."""
    from panel.io.state import set_curdoc

    doc = pn.state.curdoc
    if doc is None or doc.session_context is None or _warm_up_session():  # no page: the warm-up's run is inline
        return None

    def schedule(fn: Callable[[], None]) -> None:
        with set_curdoc(doc):
            pn.state.execute(frozen_step(doc, fn), schedule=True)  # Document.add_next_tick_callback, curdoc set

    return schedule, lambda: doc.session_context is not None


def _when_shown(make: Callable[[], Viewer]) -> pn.param.ParamFunction:
    """A tab's view, made the first time its tab is shown (`dynamic` tabs draw only the active one): a session
    pays for the views it opens, not for all of them, and a hidden view does not follow every state change."""
    return pn.param.ParamFunction(make, lazy=True, loading_indicator=False, sizing_mode="stretch_both")


def _client_address() -> str | None | bool:
    """The client address of this server session (`False` outside a server session: tests, notebooks)."""
    doc = pn.state.curdoc
    ctx = doc.session_context if doc is not None else None
    if ctx is None:
        return False
    request = getattr(ctx, "request", None)
    return getattr(request, "remote_ip", None) if request is not None else None


def _warm_up_session() -> bool:
    """True for the document `panel serve --warm` makes at server start: a session context with no HTTP request
    behind it (no client at all). Building it runs the default model once, so that `RUNS` holds its run and
    every later session shows it at once (`AppState.start_cached`)."""
    doc = pn.state.curdoc
    ctx = doc.session_context if doc is not None else None
    request = getattr(ctx, "request", None) if ctx is not None else None
    return request is not None and getattr(request, "_request", False) is None


def _refusal() -> str | None:
    """The refusal text when this session's client is not on this machine and remote use is not enabled
    (`access.refusal`); None outside a server session and for the server's own warm-up document."""
    address = _client_address()
    return None if address is False or _warm_up_session() else refusal(address)


def _start(state: AppState) -> None:
    state.autorun = True
    state.load()
