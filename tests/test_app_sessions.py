"""Sessions of one server process share finished runs read-only and stay isolated (issue 15, load).

What two `AppState`s (two browser sessions) share: the `Model`, its `Trace` and the drawings, computed once per
process (`state.RUNS`, `session.MODELS`/`TRACES`/`RENDERS`). What they never share: their settings; a session
that changes its variant or pipeline gets a new run and leaves the other session's model, trace and drawing as
they were.
"""

from rlxviz import session
from rlxviz.app.jobs import Runner
from rlxviz.app.main import build_app
from rlxviz.app.state import RUNS, AppState
from rlxviz.ir import format_graph


def state(**kw) -> AppState:
    kw.setdefault("preset", "bert-tiny")
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


def test_second_session_shows_the_first_sessions_run_without_a_job():
    a = state()
    b = AppState(runner=Runner(background=False), autorun=False, preset="bert-tiny", seq=8)
    jobs = []
    b.runner.submit = lambda kind, fn: jobs.append(kind)  # type: ignore[method-assign]
    assert b.start_cached(), "a's finished run is in RUNS"
    assert not jobs, "no load job: the run was taken as it is"
    assert b.model is a.model and b.trace is a.trace
    assert b.autorun and not b.busy
    assert b.svg() is a.svg(), "the drawing is the shared cached text"


def test_unrun_settings_are_not_taken_from_the_cache():
    RUNS.clear()
    s = AppState(runner=Runner(background=False), autorun=False, preset="bert-tiny", seq=8)
    assert not s.start_cached()
    assert s.model is None and s.trace is None and not s.autorun


def test_the_table_of_runs_keeps_no_model_alive():
    import gc

    from rlxviz.session.loading import MODELS

    state(seq=12)
    MODELS.clear()
    gc.collect()
    s = AppState(runner=Runner(background=False), autorun=False, preset="bert-tiny", seq=12)
    assert not s.start_cached(), "the model left the model cache and no session holds it: load it again"


def test_changing_one_sessions_variant_leaves_the_other_as_it_was():
    a, b = state(), state()
    assert a.trace is b.trace
    graph_b, svg_b, labels_b = format_graph(b.current_graph), b.svg(), list(b.version_labels)
    a.variant = "extra_h1_user"
    assert a.trace is not b.trace and a.model is not b.model
    assert format_graph(a.trace.input) != format_graph(b.trace.input), "a's variant changed a's graph"
    assert format_graph(b.current_graph) == graph_b and b.svg() == svg_b and b.version_labels == labels_b
    assert b.variant == "none" and b.message_kind != "danger"
    c = AppState(runner=Runner(background=False), autorun=False, preset="bert-tiny", seq=8)
    assert c.start_cached() and c.trace is b.trace, "a's variant run did not replace the default one"


def test_pipeline_change_is_its_own_run():
    a, b = state(), state()
    a.toggle_pass(0, False)
    assert a.trace is not b.trace and a.trace.key != b.trace.key
    assert len(b.trace.steps) == len(a.trace.steps) + 1, "b still runs every pass"


def test_build_app_uses_the_cached_run(monkeypatch):
    monkeypatch.setattr(session, "default_preset", lambda: "bert-tiny")
    first = state(seq=AppState.seq)  # the default settings, run by another session (or `panel serve --warm`)
    page = build_app()
    s = page.state
    assert s.trace is first.trace and not s.busy, "the page was built with the run shown, no job queued"
    assert s.autorun


def test_only_the_servers_own_warm_up_document_skips_the_client_check(monkeypatch):
    from types import SimpleNamespace

    from bokeh.document import Document
    from bokeh.server.contexts import BokehSessionContext, _RequestProxy
    from panel.io.state import set_curdoc

    from rlxviz.app import main
    from rlxviz.app.access import ALLOW_REMOTE_ENV

    monkeypatch.delenv(ALLOW_REMOTE_ENV, raising=False)

    def session_with(request):  # as `panel serve --warm` (request None) and a real page make it
        doc = Document()
        ctx = BokehSessionContext("id", None, doc)
        ctx._request = _RequestProxy(request, arguments={}, cookies={}, headers={})
        doc._session_context = lambda: ctx
        return doc

    with set_curdoc(session_with(None)):
        assert main._warm_up_session() and main._refusal() is None
    with set_curdoc(session_with(SimpleNamespace(remote_ip="192.0.2.2"))):
        assert not main._warm_up_session() and "only serves this machine" in main._refusal()
    with set_curdoc(session_with(SimpleNamespace(remote_ip=None))):
        assert not main._warm_up_session() and main._refusal() is not None, "an unknown address is refused"


def test_the_server_start_session_starts_the_spare_loader_and_pages_do_not(monkeypatch):
    """`panel serve --warm` builds one document at server start: it starts the spare child that uploads load in
    (`session.isolated.spare_ready`), so a user's first upload does not wait for a cold interpreter; a page does not."""
    import threading
    from types import SimpleNamespace

    from bokeh.document import Document
    from bokeh.server.contexts import BokehSessionContext, _RequestProxy
    from panel.io.state import set_curdoc

    from rlxviz.app import main

    started = threading.Event()
    monkeypatch.setattr(main, "spare_ready", started.set)
    monkeypatch.setattr(main.AppState, "start_cached", lambda self: True)  # no model run: only the start-up matters

    def session_with(request):
        doc = Document()
        ctx = BokehSessionContext("id", None, doc)
        ctx._request = _RequestProxy(request, arguments={}, cookies={}, headers={})
        doc._session_context = lambda: ctx
        return doc

    with set_curdoc(session_with(SimpleNamespace(remote_ip="127.0.0.1"))):
        main.build_app()
    assert not started.wait(0.5)
    with set_curdoc(session_with(None)):
        main.build_app()
    assert started.wait(10)
