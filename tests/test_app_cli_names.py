"""The app names what the CLI names, from the same function: the pipeline a run went through (the Why tab said
"layer 1 (app pipeline)" where `rlxviz explain` said "(canonical pipeline)" for the same default passes), and a place
whose node has no path (a chip's tooltip said "-" where `explain` says "@ %17 (-)")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clirun import run

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.passes import CANONICAL_ORDER
from rlxviz.passes.trace import place_label
from rlxviz.session import build_pipeline, version_index


@pytest.fixture(scope="module")
def tiny() -> AppState:
    return AppState(runner=Runner(background=False), preset="bert-tiny")


def _pipeline_said(text: str) -> set[str]:
    return set(re.findall(r"\((\w+) pipeline\)", text))


def test_the_why_tab_names_the_pipeline_as_explain_does(tiny, capsys):
    code, out, _ = run(capsys, "explain", "bert-tiny", "--layer", "1")
    assert _pipeline_said(out) == {"canonical"}, out
    assert _pipeline_said(tiny.why_layer(1)) == {"canonical"}


def test_a_pass_list_is_named_as_its_profile_is():
    assert build_pipeline(list(CANONICAL_ORDER)).name == build_pipeline("canonical").name == "canonical"
    stage = "fuse_sdpa/rope_heads"
    assert build_pipeline([*CANONICAL_ORDER, f"-{stage}"]).name == build_pipeline(f"canonical,-{stage}").name
    assert build_pipeline(list(CANONICAL_ORDER[:-1])).name == "custom"
    assert build_pipeline(list(CANONICAL_ORDER), name="mine").name == "mine"


def test_the_apps_edited_pipeline_is_custom():
    s = AppState(runner=Runner(background=False), preset="bert-tiny")
    last = max(i for i, p in enumerate(s.passes) if p == CANONICAL_ORDER[-1])
    s.toggle_pass(last, False)
    assert s.trace.pipeline == "custom"
    s.toggle_pass(last, True)
    assert s.trace.pipeline == "canonical"


PARALLEL = Path(__file__).parent / "data" / "cases" / "16-parallel-block-shared-input.rlx"
"""A parallel block whose shared-input matmuls have no node path: the chips named such a place `-`."""


def test_a_pathless_place_is_named_by_its_node_as_explain_names_it(capsys):
    s = AppState(runner=Runner(background=False), source="ir", ir_text=PARALLEL.read_text())
    code, out, _ = run(capsys, "explain", PARALLEL)
    cli = set(re.findall(r"@ %(\d+) \(-\)", out))
    assert cli, out  # explain names a pathless place by its node
    items = [(item, at) for row in s.version_rows() for group, xs in row["not_near_misses"].items()
             for item, at in zip(xs, row["not_near_miss_at"][group], strict=True)]
    items += [(item, at) for row in s.version_rows() for item, at in zip(row["rejected"], row["rejected_at"],
                                                                          strict=True)]
    pathless = [(item, at) for item, at in items if str(at) in cli]
    assert pathless, items
    for item, at in pathless:
        assert item.startswith(f"{place_label(at, '', with_node=True)}: "), item  # `%17 (-): `, as explain says it
    assert not [item for item, _ in items if item == "-" or item.startswith("-:")], items
    assert place_label(17, "", with_node=True) == "%17 (-)" and place_label(17, "") == "%17"


def test_a_later_run_of_a_pass_is_named_as_after_takes_it(tmp_path, capsys):
    """The final version of the canonical run is dead_code_elimination's second, no-op run: `rlxviz render` said
    "after dead_code_elimination: 27 ops" and titled the picture so, the first run's name (the app's list said the
    same for both). Both now name it `dead_code_elimination#2`, as `--after` takes it (`Trace.step_names`)."""
    for view in ("full", "layers"):
        code, _, err = run(capsys, "render", "bert-tiny", "--seq", 8, "--view", view, "-o", tmp_path / "a.svg")
        assert code == 0 and ": after dead_code_elimination#2: " in err, err
        assert "after dead_code_elimination#2, in the graph" in (tmp_path / "a.svg").read_text()
    code, _, err = run(capsys, "render", "bert-tiny", "--seq", 8, "--after", "dead_code_elimination#2", "--before",
                       "-o", tmp_path / "b.svg")
    assert code == 0 and "before dead_code_elimination#2, in the graph" in (tmp_path / "b.svg").read_text()
    s = AppState(runner=Runner(background=False), preset="bert-tiny", hide_unchanged=False)
    labels = s.version_labels
    assert labels.count("after dead_code_elimination") == 1 and labels[-1] == "after dead_code_elimination#2"
    k = version_index(s.trace, "dead_code_elimination#2")
    assert s.trace.versions()[k][0] == labels[-1]
