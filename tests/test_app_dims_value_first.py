"""An `.onnx` file's unbound dims said value first (newcomer run: qwen2.kv / starcoder2.kv opened by path, the stale
box cut its line at "qwen2.kv.npz beside the model hold…", before `past=7`, the value the CLI gives as `--dim
past=7`). The CLI and the app lay the message out from one source (`UnboundDimsError.said_as`), the dims to type
first; the stale box unfolds the whole message."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.stale import MORE_SUMMARY
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView
from rlxviz.app.wording import APP_DIMS, STALE_WHY_CHARS, explain_error, stale_more, stale_why
from rlxviz.session import CLI_DIMS, UnboundDimsError, load

ZOO = Path(__file__).resolve().parents[1] / "tests/fixtures/onnx/zoo"
KV = [ZOO / "qwen2.kv.onnx", ZOO / "starcoder2.kv.onnx"]


def refused(path: Path) -> UnboundDimsError:
    with pytest.raises(UnboundDimsError) as e:
        load(str(path))
    return e.value


@pytest.mark.parametrize("path", KV, ids=lambda p: p.stem)
def test_the_cli_and_the_app_say_the_dim_and_its_value_first(path: Path):
    e = refused(path)
    assert e.proposed == {"past": 7} and e.beside == f"{path.stem}.npz", e.__dict__
    cli, app = str(e), explain_error(e, "checkpoint", "bert-tiny", onnx=True)
    assert cli == e.said_as(CLI_DIMS) and app == e.said_as(APP_DIMS)  # one layout, each front end's words
    assert cli.startswith(f"{path}: --dim past=7 (from the shapes in {path.stem}.npz beside the file), or --inputs "
                          f"{path.with_suffix('.npz')}; input 'attention_mask'"), cli
    assert app.startswith(f"{path}: set past=7 in the sidebar's Input dims box (from the shapes in {path.stem}.npz "
                          "beside the model); input 'attention_mask': dimension 1 (past + 1) needs 'past'"), app
    assert "--dim" not in app and "--inputs" not in app


@pytest.mark.parametrize("path", KV, ids=lambda p: p.stem)
def test_the_stale_box_keeps_the_value_and_unfolds_the_whole_message(path: Path, monkeypatch):
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(ZOO))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    why = WhyView(state=s)
    s.param.update(checkpoint_dir=str(path), source="checkpoint")
    assert s.message_kind == "danger" and s.model.name == "bert-tiny", s.message
    said = s.stale.split("loading the new one failed: ", 1)[1].rsplit(" Fix the input", 1)[0]
    assert said.endswith("…") and len(said) <= STALE_WHY_CHARS, said  # cut: the whole line is longer
    assert "set past=7 in the sidebar's Input dims box" in said, said  # what to type, before the cut
    assert s.stale_more == s.message.strip() and "needs 'past'" in s.stale_more
    banner = why.stale.banner.object
    assert f"<summary title=\"{path}: set past=7 in the sidebar&#x27;s Input dims box" in banner, banner
    assert f">{MORE_SUMMARY}</summary>{path}: set past=7" in banner and "needs &#x27;past&#x27;" in banner, banner
    s.dims = "past=7"  # as the box's line says
    assert s.model.name == path.stem and s.stale == "" and s.stale_more == "", s.message
    assert not why.stale.banner.visible and "<details" not in why.stale.banner.object


def test_stale_more_is_the_whole_message_only_where_the_line_is_cut():
    short = "m.onnx: IR syntax error: undefined value %9999"
    assert stale_more(short) == "" and stale_more(short + ".") == ""
    long = "m.onnx: " + "x" * STALE_WHY_CHARS
    assert stale_why(long).endswith("…") and stale_more(long) == long
    two = f"{short}\nA shape that follows from them does not fit."
    assert stale_more(two) == two


def test_the_unfolded_message_is_escaped_data_in_one_html_block():
    """A message quotes the model's own text (names, paths): escaped; its lines joined by `<br>`, no blank line
    (which would end the `<details>` HTML block inside the Markdown pane, the rest read as Markdown)."""
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    why = WhyView(state=s)
    s.param.update(stale="Stale: showing the previous model (bert-tiny)", stale_more="a <img src=x>\n\n**b**")
    banner = why.stale.banner.object
    fold = banner[banner.index("<details"):]
    assert "<img" not in banner and "&lt;img src=x&gt;<br>**b**</details>" in fold, fold
    assert "\n" not in fold
