"""The layer view's box and open frame say the verdict's own words, those of `explain --json` and the Why tab (a
newcomer run, case n4-15: the frame read `encoder.layer.0: fused [click here to fold]` and, at version 22,
`final: fused; at this version: ...`, while the Why tab and `explain` said `fused as far as legal`). The words come
from `LayerVerdict.status`, for every verdict kind: fused, fused as far as legal, fused as far as rlxviz's ops go, not
fused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz import session
from rlxviz.session import opening as SESSION_OPEN
from rlxviz.session.render import View, dot

CASES = Path(__file__).parent / "data" / "cases"
PROBE = ("  %43 = mul(%39, %39) : f32[2, 8, 64] @encoder.layer.0\n"
         "  %44 = reduce_mean(%43) {axes=[2], keepdims=false} : f32[2, 8] @encoder.layer.0\n")


def _n4_15(on: str = "sum1") -> str:
    """Case n4-15 (a probe returned as output #1 reads the first residual sum), or its probe moved to h1 (`h1`) or to
    the second residual sum (`sum2`): each a layer fused as far as legal, with other illegal fusions."""
    text = next(CASES.glob("n4-15-*.rlx")).read_text()
    assert PROBE in text
    if on == "h1":
        text = text.replace("mul(%39, %39)", "mul(%42, %42)")
    elif on == "sum2":
        text = text.replace(PROBE, "").replace("  return %57, %44", PROBE.replace("%39", "%54") + "  return %57, %44")
    return text


def _explain(capsys, monkeypatch, *args: str) -> tuple[dict, object]:
    """(`explain ARGS --json`, the trace it judged), in-process."""
    seen = []
    real = session.run_pipeline
    monkeypatch.setattr(SESSION_OPEN, "run_pipeline", lambda g, p: seen.append(real(g, p)) or seen[-1])
    code, out, err = cli_run(capsys, "explain", *args, "--json")
    assert "Traceback" not in err and code in (0, 1), err
    return json.loads(out), seen[-1]


def _frame(source: str, title: str) -> str:
    """The words after `TITLE: ` on an open layer's frame, up to its `[click here to fold]`."""
    m = re.search(rf'label="{re.escape(title)}: ([^"]*?)\s+\[click here to fold\]"', source)
    assert m is not None, source[:1500]
    return m.group(1)


def _bold(source: str, key: str) -> list[str]:
    """The bold lines of a folded box's label: its title, then its status words."""
    line = re.search(rf"^\s*{key} \[label=<(.*)$", source, re.M).group(1)
    return re.findall(r"<B>(.*?)</B>", line)


@pytest.mark.parametrize("source, want", [
    ("n4-15", "fused as far as legal"), ("n4-15:h1", "fused as far as legal"), ("n4-15:sum2", "fused as far as legal"),
    ("bert-tiny", "fused"), ("bert-tiny:dead_h1_user", "not fused"),
    ("bert-tiny:extra_h1_user", "fused as far as legal"), ("bert-tiny:tanh_gelu", "fused as far as rlxviz's ops go"),
    ("vit.onnx", "fused as far as rlxviz's ops go"),
])
def test_frame_and_box_say_the_verdicts_words(capsys, monkeypatch, tmp_path, source, want):
    name, _, variant = source.partition(":")
    if name == "n4-15":
        path = tmp_path / f"n4-15-{variant or 'case'}.rlx"
        path.write_text(_n4_15(variant or "sum1"))
        j, trace = _explain(capsys, monkeypatch, str(path))
    elif name.endswith(".onnx"):
        j, trace = _explain(capsys, monkeypatch, str(Path(__file__).parent / "fixtures" / "onnx" / name))
    else:
        j, trace = _explain(capsys, monkeypatch, name, *(["--variant", variant] if variant else []))
    assert j["layers"]
    assert j["layers"][0]["status"] == want  # the case is of the kind it is meant to be
    last = len(trace.versions()) - 1
    for d in j["layers"]:
        k, title, word = d["layer"], None, d["status"]
        for version in (last, 0):
            opened = dot(trace, View(version=version, view="layers", expanded=(k,)))
            title = title or re.search(rf'id=layer{k} label="([^"]*?): ', opened).group(1)
            frame = _frame(opened, title)
            folded = _bold(dot(trace, View(version=version, view="layers")), f"layer{k}")
            if version == last:  # the layer as it ends: the verdict's words, nothing else
                assert frame == word or frame.startswith(f"{word} (same as "), (frame, word)
                assert folded[1] == word, folded
            else:  # the input graph: the final verdict's words, then the state so far
                assert frame.startswith(f"final: {word}; at this version: "), (frame, word)
                assert folded[1] == f"final: {word}", folded
