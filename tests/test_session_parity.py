"""One question, one answer: the CLI, the notebook helpers (`rlxviz.teach`) and the app's `AppState` all
ask the session, so loading, a layer's status, timing verdicts and a limits refusal read the same.

Three models: MiniLM-shaped BERT, a BERT teaching variant broken in layer 0, and the LLaMA block.
Timing is tiny (seq 8, one timed call, no warm-up): the test compares verdicts, not speed.
"""

import json

import pytest

from rlxviz import cli, teach
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import format_graph, parse_ir

SEQ = 8

CASES = [  # (model, variant, layer asked about)
    ("minilm-shaped", "none", 3),
    ("bert-tiny", "dead_h1_user", 0),
    ("llama-block", "none", 0),
]


def cli_run(capsys, *args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def app_state(model, variant, **kw):
    return AppState(runner=Runner(background=False), preset=model, variant=variant, seq=SEQ, style="default", **kw)


def model_args(model, variant):
    return [model, "--seq", SEQ, *(["--variant", variant] if variant != "none" else [])]


@pytest.mark.parametrize("model, variant, layer", CASES)
def test_same_answers_from_the_cli_the_notebooks_and_the_app(capsys, monkeypatch, model, variant, layer):
    monkeypatch.delenv("RLXVIZ_MAX_MEMORY_MB", raising=False)
    monkeypatch.delenv("RLXVIZ_MAX_TENSOR_MB", raising=False)
    nb_variant = None if variant == "none" else variant

    # load: the same graph, as IR text
    code, cli_ir, _ = cli_run(capsys, "ir", *model_args(model, variant))
    assert code == 0
    nb_model = teach.load(model, seq=SEQ, variant=nb_variant)
    state = app_state(model, variant, repeat=1, warmup=0, hide_unchanged=False)
    assert state.message_kind != "danger", state.message
    assert cli_ir.strip() == format_graph(nb_model.graph).strip() == format_graph(state.model.graph).strip()
    assert len(parse_ir(cli_ir).compute_nodes()) > 10

    # status of layer N: the same verdict and the same text
    nb_trace = teach.build_pipeline("canonical").run(nb_model.graph)
    nb_status = teach.layer_status(nb_trace, layer)
    app_status = state.layer_status(layer)
    code, cli_text, _ = cli_run(capsys, "explain", *model_args(model, variant), "--layer", layer)
    _, cli_json, _ = cli_run(capsys, "explain", *model_args(model, variant), "--layer", layer, "--json")
    cli_layer = json.loads(cli_json)["layers"][0]
    assert code == (0 if nb_status.fused else 1)
    assert cli_layer["nothing_to_change"] == nb_status.fused == app_status.fused
    assert cli_layer["fused"] == (nb_status.fused and not nb_status.gap_only)  # as the headline counts it
    assert cli_layer["architecture"]["kind"] == nb_status.architecture.kind == app_status.architecture.kind
    first = [s.first.guard if s.first else None for s in (nb_status, app_status)]
    assert (cli_layer["first"] or {}).get("guard") == first[0] == first[1]
    text = nb_status.render()
    layer_lines = cli_text.strip().splitlines()[1:]
    while layer_lines and layer_lines[0].startswith("  "):  # the headline's notes ("1 of them only as far as ...")
        layer_lines.pop(0)
    assert text == app_status.render() and layer_lines == text.splitlines()
    assert text.splitlines()[-1].strip() in state.why_layer(layer).replace("&nbsp;", " ").replace("\\", "")
    if variant != "none":
        assert not nb_status.fused and first[0] == "h1_user_count"

    # timing verdicts: every version, the same label and verdict
    code, cli_json, _ = cli_run(capsys, "time", *model_args(model, variant), "--repeat", 1, "--warmup", 0, "--json")
    cli_rows = [(r["label"], r["verdict"], r["same_as"]) for r in json.loads(cli_json)["versions"]]
    nb_rows = [(r.label, r.verdict, r.same_as) for r in teach.time_versions(nb_trace, nb_model.random_feeds(seed=0),
                                                                            nb_model.weights, warmup=0, repeat=1)]
    state.time_all()
    assert state.message_kind != "danger", state.message
    app_rows = [(r["version"], r["verdict"]) for r in state.timings]
    assert cli_rows == nb_rows and [(label, v) for label, v, _ in cli_rows] == app_rows
    assert code == 0 and {v for _, v, _ in cli_rows} <= {"ok", "unchanged"}

    # a limits refusal: the same one line
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "0.01")
    code, _, err = cli_run(capsys, "explain", *model_args(model, variant))
    with pytest.raises(teach.TeachError) as nb_error:
        teach.load(model, seq=SEQ, variant=nb_variant)
    refused = app_state(model, variant)
    assert code == 2 and err.strip() == f"rlxviz explain: error: {nb_error.value}"
    assert refused.message_kind == "danger" and refused.message == str(nb_error.value) and refused.model is None
    assert f"{model}: a run needs" in refused.message and "(RLXVIZ_MAX_MEMORY_MB)" in refused.message


def test_one_set_of_defaults_for_the_cli_the_app_and_the_session():
    """A model opened without options is built with the same batch and sequence length by every CLI subcommand,
    the app and `session.load`, and `rlxviz time` times as many rounds as the app's Timing tab."""
    import inspect

    from rlxviz import session

    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    for name in ("explain", "render", "ir", "time", "export"):
        extra = {"export": ["out.onnx"], "render": ["-o", "x.svg"]}.get(name, [])
        args = sub[name].parse_args(["bert-tiny", *extra])
        assert (args.batch, args.seq) == (session.DEFAULT_BATCH, session.DEFAULT_SEQ), name
    timed = sub["time"].parse_args(["bert-tiny"])
    assert (timed.repeat, timed.warmup) == (session.DEFAULT_REPEAT, session.DEFAULT_WARMUP)
    from rlxviz.session.defaults import MIN_VERDICT_ROUNDS

    assert session.DEFAULT_REPEAT >= MIN_VERDICT_ROUNDS  # the default run gives a verdict (10 rounds never did)
    state = AppState(runner=Runner(background=False), autorun=False)
    assert (state.batch, state.seq, state.repeat, state.warmup) == (
        session.DEFAULT_BATCH, session.DEFAULT_SEQ, session.DEFAULT_REPEAT, session.DEFAULT_WARMUP)
    params = inspect.signature(session.load).parameters
    assert (params["batch"].default, params["seq"].default) == (session.DEFAULT_BATCH, session.DEFAULT_SEQ)
