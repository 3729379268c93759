"""One verdict, every form (issues 36 and 38): `rlxviz explain`'s text and its `--json`, the app's Why tab, the
layers drawing and the node panel are formatters of one `passes.why.RunVerdict`, so every fact in one is in the
others: the headline (layers fused / checked, ok), each layer's status word, its first counted rejection (rule,
guard, fix), each of its misses (rule, guard) and its fused ops (op, pass, how many,
first and last id: the text groups more than 3 of a kind, `--json` lists each).

Checked on every preset and a sample of the handed cases (`tests/data/cases`, copies of `../shared/cases`), of the
ONNX fixtures and of the zoo; the slow sweeps check the rest, so `make test` checks every handed case, ONNX fixture
and ORT-optimized file once, and of the zoo every architecture and form (`zoo_sample`; every file with
`RLXVIZ_SWEEP=all`).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from clirun import file_inputs
from clirun import run as cli_run
from zoo_sample import zoo_files

from rlxviz import session
from rlxviz.app.derived import version_rows
from rlxviz.app.explain import _verdict as node_panel_verdict
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import counts_html
from rlxviz.app.state import AppState
from rlxviz.models import PRESETS
from rlxviz.passes.refusal_kinds import kind_words
from rlxviz.passes.trace import layer_label, layer_of
from rlxviz.passes.why.standing import held_by, place_gaps, standing
from rlxviz.passes.why.verdict import OP_GAP_GROUP, RunVerdict, first_gap, why_step
from rlxviz.session import opening as SESSION_OPEN
from rlxviz.session.render import View, picture, verdicts
from rlxviz.session.status import layer_status, verdict_pass
from rlxviz.viz.overlay import before_caption

ROOT = Path(__file__).parent
HANDED = sorted((ROOT / "data" / "cases").glob("*.rlx"))
FIXTURES = [ROOT / "fixtures" / "onnx" / f"{n}.onnx" for n in ("bert", "gpt2", "llama", "vit")] + sorted(
    (ROOT / "fixtures" / "onnx" / "cases").glob("*.onnx"))
ORTOPT = sorted((ROOT / "fixtures" / "onnx" / "ortopt").glob("*.onnx"))
ZOO = sorted((ROOT / "fixtures" / "onnx" / "zoo").glob("*.onnx")) + ORTOPT
ZOO_SWEPT = zoo_files() + ORTOPT
"""The zoo files `make test` checks: every architecture in its rarest form and every form (`zoo_sample`, 56 of the
zoo's 138; all with `RLXVIZ_SWEEP=all`), and every ORT-optimized file."""
HANDED_SAMPLE = [p for p in HANDED if p.stem in (
    "03e-wrong-factor", "esm-like-q-scaled-before-rope", "gelu-erf-wrong-const-bert", "n3-08x-folded-bias-not-liftable",
    "n4-06-deepnorm-residual", "n4-09-dequant-scale-after-matmul", "n4-13-cross-layer-kv-sharing",
    "n4-15-residual-logged", "n3-09-cross-attention", "16-parallel-block-shared-input")]
"""Handed cases of every shape of answer: no layer path, NOT fused with misses, an unrecognized form, fused as far
as legal, a decoder layer, a parallel block."""
FIXTURES_SAMPLE = [p for p in FIXTURES if p.stem in ("bert", "llama", "falcon")]
ZOO_SAMPLE = [p for p in ZOO if p.stem in ("albert.ts-eager", "bert.dynamo-sdpa", "bloom.dynamo-eager", "ernie.qdq",
                                           "clip-text.ts-eager")]
"""A few zoo files, among them one where text and `--json` used to disagree (albert: a fusion that left its
activation out was a miss only in `--json`)."""

_HEAD = re.compile(r"^(\S.*?): (fused|NOT fused|held back by [^:]+)")
_COUNT = re.compile(r"\((\S+) pipeline\): (\d+)/(\d+) layer\(s\) fused as expected(?:; (.+))?$")
_UNCHECKED = r"(?:; not checked whether the fix alone is enough in \d+ of them \(no what-if builds it there\))?"
_GAPS = re.compile(r"^(\d+) [^(]+?(?:, (\d+) [^(]+)? \(rlxviz lacks (.+): a compiler fix(?:, nothing in the model to "
                   r"change" + _UNCHECKED + r"|(?:; (?:alone it is not enough in \d+ of them: .+? fails next|"
                   r"a fix alone is not enough in \d+ of them: "
                   r"(?:with the fix for .+? alone, .+? fails next(?:; )?)+))?"
                   + _UNCHECKED + r"(?:; a workaround in "
                   r"the model in \d+ of them \((?:(?:in \d+ of them )?it changes the numbers at rounding level only; "
                   r")?their gap lines name it\))?)\)$")
"""The headline's count of the layers held back only by rlxviz's ops (`text.gap_words`): one or two counts, the
forms."""


def _blocks(text: str) -> list[tuple[str, str]]:
    """`(status word, block text)` of each layer in `explain`'s text, in order: a block is a line `LABEL: fused...` /
    `LABEL: NOT fused...` and the indented lines under it."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = _HEAD.match(line)
        if m is not None and not line.startswith(" "):
            far = re.match(r": (fused as far as [^:]+):", line[m.end(1):])  # legal, rlxviz's ops, or both
            word = (far.group(1) if far else "not fused" if m.group(2) == "NOT fused" else
                    m.group(2) if m.group(2).startswith("held back") else "fused")
            out.append((word, [line]))
        elif line.startswith(" ") and out:
            out[-1][1].append(line)
        elif out and not line.startswith(" "):
            out.append(("", [line]))  # a run-level line after the layers ends the last block
    return [(w, "\n".join(b)) for w, b in out if w]


def _miss_key(miss: str) -> tuple[str, str]:
    """`(rule, guard)` of a miss as `--json` writes it (`MissedFusion.__str__`)."""
    rule, rest = miss.split(" @ ", 1)
    guard = rest.split("): ", 1)[1].split(" ", 1)[0].split(":", 1)[0]
    return rule, guard


def _text_facts(block: str) -> set[tuple[str, str]]:
    """`(rule, guard)` of every rejection or miss a layer's text block names: the first rejection, `also rejected`,
    `also missed` and `also unrecognized` lines."""
    facts = set()
    lines = block.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("first rejection: "):
            guard = lines[i + 1].strip().removeprefix("guard ").split(" ", 1)[0]
            facts.add((s.removeprefix("first rejection: "), guard))
        elif s.startswith("also rejected: "):
            rule, guard = s.removeprefix("also rejected: ").split(": ", 1)
            facts.add((rule, guard.split(" ", 1)[0]))
        elif s.startswith(("also missed: ", "also unrecognized: ")):
            facts.add(_miss_key(s.split(": ", 1)[1]))
    return facts


_GROUP = re.compile(r"^(\S+) x(\d+) \(([^;()]+); ([^()]+)\)$")  # ids: `%A ... %B` runs and single `%C`, by ", "
_ITEM = re.compile(r"^(\S+) %(\d+) \(([^()]+)\)$")


def _done_facts(block: str) -> list[tuple[str, str, int, str, str]] | None:
    """`(op, pass, count, first id, last id)` of each run of one op from one pass on a layer's `fused as expected:` /
    `fused as far as legal:` line, in order (a grouped item `OP xN (PASS; %A ... %B)` or listed items); None when the
    block has no such line."""
    head = block.splitlines()[0]
    far = re.search(r": fused as far as [^:]+: ", head)  # legal, rlxviz's ops, or both
    for word in (": fused as expected: ", *([far.group(0)] if far else [])):
        if word in head:
            items = head.split(word, 1)[1]
            break
    else:
        return None
    runs: dict[tuple[str, str], list] = {}
    for item in ([] if items in ("nothing to fuse", "") else re.split(r", (?![^()]*\))", items)):
        if (m := _GROUP.match(item)) is not None:
            ids = re.findall(r"%(\d+)", m[4])
            runs.setdefault((m[1], m[3]), []).append((int(m[2]), min(ids, key=int), max(ids, key=int)))
        else:
            m = _ITEM.match(item)
            assert m is not None, item
            runs.setdefault((m[1], m[3]), []).append((1, m[2], m[2]))
    return [(op, p, sum(c for c, _, _ in r), min((x[1] for x in r), key=int), max((x[2] for x in r), key=int))
            for (op, p), r in runs.items()]


def _json_done(done: list[str]) -> list[tuple[str, str, int, str, str]]:
    """The same facts from `--json`'s full `done` list."""
    runs: dict[tuple[str, str], list[str]] = {}
    for item in done:
        m = _ITEM.match(item)
        assert m is not None, item
        runs.setdefault((m[1], m[3]), []).append(m[2])
    return [(op, p, len(ids), min(ids, key=int), max(ids, key=int)) for (op, p), ids in runs.items()]


def _illegal_facts(block: str) -> set[tuple[str, str]]:
    """`(rule, guard)` of every refusal a layer's text calls illegal for the layer (not counted)."""
    facts = set()
    lines = block.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("illegal here: "):
            facts.add((s.removeprefix("illegal here: "), lines[i + 1].strip().removeprefix("guard ").split(" ")[0]))
        elif s.startswith("illegal here (not counted): "):
            rule, guard = s.removeprefix("illegal here (not counted): ").split(": ", 1)
            facts.add((rule, guard.split(" ", 1)[0]))
    return facts


def _explain(capsys, monkeypatch, *args) -> tuple[int, str, dict, object]:
    """(exit code, text, json, trace) of `rlxviz explain ARGS` and `... --json`, in-process."""
    seen = []
    real = session.run_pipeline
    # the CLI runs the pipeline through `session.open` (`open_trace`), which calls it by its own import
    monkeypatch.setattr(SESSION_OPEN, "run_pipeline", lambda g, p: seen.append(real(g, p)) or seen[-1])
    code, text, err = cli_run(capsys, "explain", *args)
    assert "Traceback" not in err, err
    jcode, out, err = cli_run(capsys, "explain", *args, "--json")
    assert "Traceback" not in err and jcode == code, err
    assert seen and seen[0] is seen[-1]
    return code, text, json.loads(out), seen[-1]


_SAID = re.compile(r"(\w+) ran before and said no here: (\w+) \((.*?)\): ")
"""A "said no here" clause of a refusal's message (`report._what_ran`): the earlier pass, its guard and the words its
refusal is named by, `a gap in rlxviz's ops: FORM` or the refusal's kind."""
_GAP_SAID = "a gap in rlxviz's ops"


def _said_standings(trace, name: str, guard: str) -> dict[bool, set[str]]:
    """Whether each headline refusal of pass `name` at `guard` in `trace` stands at a gap in rlxviz's ops (its
    `standing`, what the chips, `explain -v` and `--json` read) -> the words a "said no here" clause may name it by."""
    out: dict[bool, set[str]] = {}
    for s in trace.steps:
        for head in s.rejections:
            r = (held_by(trace, head) or head) if head.headline else head  # a place the model's own term holds (t5's
            if r.pass_name == name and r.guard == guard and head.headline:  # cross-attention) is said by that term
                st = standing(trace, head)
                gap = st is not None and st[0] == OP_GAP_GROUP
                words = f"{_GAP_SAID}: {' and '.join(place_gaps(trace, r))}" if gap else kind_words(r.kind, r.dead)
                out.setdefault(gap, set()).add(words)
    return out


def _check_said_no_here(text: str, trace) -> int:
    """Every "said no here" clause of `text` (`explain`'s text, the app's Why tab) names the earlier refusal by its
    standing: `a gap in rlxviz's ops: ...` only where its standing is the chips' `△` (`OP_GAP_GROUP`), else by its
    kind (`the model's own term`), as `explain -v`, the chips and `--json` name it (n3-09's cross-attention
    `self_attention` was a gap in the Why line alone). The clauses checked."""
    said = _SAID.findall(text)
    for name, guard, words in said:
        standings = _said_standings(trace, name, guard)
        gap = words.startswith(_GAP_SAID)
        assert gap in standings, (name, guard, words, standings)
        assert words in standings[gap], (name, guard, words, standings)
    return len(said)


def _check_cli(code: int, text: str, j: dict, trace) -> RunVerdict:
    """Every fact of `--json` is in the text and every fact of the text in `--json`; both are the run's verdict."""
    v = RunVerdict.of(trace)
    assert j["ok"] == v.ok
    _check_said_no_here(text, trace)
    if v.ok:  # 1 only for a failed import or numeric check, which the verdict does not hold
        numbers = j["numeric_check"]
        assert code == 0 or (code == 1 and (numbers is not None and not numbers["ok"] or j["import_checks"])), text
    else:
        assert code == (3 if v.crashed else v.exit_status), text
    if j["layers"]:
        heads = [m for line in text.splitlines() if (m := _COUNT.search(line))]
        assert len(heads) == 1, text
        assert (int(heads[0].group(2)), int(heads[0].group(3))) == (j["fused_layers"], j["checked_layers"])
        gaps = _GAPS.match(heads[0].group(4) or "")  # the layers held back by rlxviz's ops, counted apart
        assert (gaps is None) == (j["gap_layers"] == 0) == (heads[0].group(4) is None), heads[0].group(0)
        if gaps is not None:
            assert int(gaps.group(1)) + int(gaps.group(2) or 0) == j["gap_layers"]
            assert gaps.group(3) == ", ".join(j["gap_forms"])
    else:
        assert f"{len(j['misses'])} missed fusion(s)" in text
        for m in j["misses"]:
            assert m in text
    blocks = _blocks(text)
    assert len(blocks) == len(j["layers"]), (text, [d["label"] for d in j["layers"]])
    for (word, block), d, lv in zip(blocks, j["layers"], v.layers, strict=True):
        assert word == d["status"] == lv.status, (block, d["status"])
        assert block.startswith(d["label"] + ":"), (block, d["label"])
        want = {_miss_key(m) for m in d["misses"]}
        first = d["first"]
        if first is not None:
            want.add((first["rule"], first["guard"]))
            assert f"first rejection: {first['rule']}\n" in block + "\n" and f"guard {first['guard']} (" in block
            if first["compiler_fix"]:  # --json names each line as the text does
                assert f"compiler fix: {first['compiler_fix']}" in block
        else:
            assert "first rejection" not in block
        want |= {(o["rule"], o["guard"]) for o in d["rejections"]}
        assert _text_facts(block) == want, (block, want)  # each way: nothing only in one of the two
        assert _illegal_facts(block) == {(o["rule"], o["guard"]) for o in d["illegal"]}, block
        if (done := _done_facts(block)) is not None:  # the fused ops: grouped in the text, listed in --json
            assert done == _json_done(d["done"]), (block, d["done"])
    return v


def _check_gap_drawing(trace, layer, g, ov) -> int:
    """A layer held back only by gaps in rlxviz's ops (`gap_only`): the "why" drawing (`g`, `ov`) is the Graph tab's
    before pane at the pass of its first gap refusal (`why_step`), the same graph and marks, its first gap's place
    drawn `△` (`Overlay.gaps`) and its title saying so. The anchor of that place."""
    k = why_step(trace, layer)
    assert k is not None and g is trace.steps[k].before, (layer, k)
    pane, before, _ = picture(trace, View(version=k + 1, side="before"))
    assert pane is g and before.standings == ov.standings and before.gap_names == ov.gap_names
    gap = first_gap(trace, layer, k)
    at = [a for a in gap.at if (gap.rule, a) in ov.gaps]
    assert at, (layer, gap, ov.gaps)
    assert ov.title.startswith(f"{layer_status(trace, layer).status}: △ {gap.rule} @ %{at[0]}: ") and \
        ov.title.endswith(before_caption(trace.steps[k], trace, layer))  # the layer's own counts, said as such
    assert before.title.startswith(f"before {trace.steps[k].pass_name}, in the graph: ")
    return at[0]


def _check_drawing_and_panel(trace, v: RunVerdict) -> None:
    """The layers drawing's boxes, the "why" side and the node panel say what the verdict says."""
    boxes = verdicts(trace)
    last = len(trace.versions()) - 1
    for lv in v.layers:
        first = lv.first
        assert boxes[lv.layer].fused == lv.fused and boxes[lv.layer].guard == (first.guard if first else "")
        g, ov, _ = picture(trace, View(version=last, side="why", focus=lv.layer))
        ran = first is not None and any(s.pass_name == first.pass_name for s in trace.steps)
        if lv.gap_only:  # its first gap, drawn `△` as the Graph tab's before pane draws it
            anchor = _check_gap_drawing(trace, lv.layer, g, ov)
            rep = node_report(g, anchor, trace)  # its gap's rule, a refusal `△` (a soft one: with its fusion)
            gap = first_gap(trace, lv.layer, why_step(trace, lv.layer))
            # the gap's own places: another place of its rule that binds the node stands as its own (clip-text's %98,
            # whose matmul fuse_attention_block takes: `taken later`, no gap)
            said = [x for x in rep["decisions"] if x["rule"] == gap.rule and x.get("anchor", gap.at[0]) in gap.at]
            assert said and all(x["standing"] == OP_GAP_GROUP for x in said if "standing" in x), said
            if rep["layer"] == lv.layer:  # the panel's verdict is its node's layer's
                assert rep["verdict"]["gaps"] == lv.op_gaps
                assert all(f"rlxviz's ops lack: {x}" in _plain(report_markdown(rep)) for x in lv.op_gaps)
            else:  # a gap anchored in another layer's box (`trace.REFUSAL_LAYER_RULE`: clip-text's fc2 bias add, named
                # after layer 1's norm, is layer 0's place): its role says whose place it is
                assert any(x["role"].endswith(f" in {layer_label(lv.layer)}") for x in said), said
        else:
            assert g is (trace.step(first.pass_name).before if ran else trace.final)
        p = node_panel_verdict(trace, lv.layer)
        assert p is not None and p["fused"] == lv.fused and p["legal_only"] == lv.legal_only
        assert (p["rule"], p["guard"], p["fix"]) == ((first.rule, first.guard, first.fix) if first else ("", "", ""))
        if first is not None and ran:  # the node panel of the first rejection's node words it as `explain` does
            rep = node_report(g, first.nodes[0] if first.nodes else first.subject, trace)
            said = [x for x in rep["decisions"] if x["rule"] == first.rule and x["guard"] == first.guard]
            assert said and said[0]["message"] == first.message and said[0]["hint"] == first.hint


def _plain(markdown: str) -> str:
    """Rendered-Markdown text of an app pane, near enough to the CLI's text: escapes undone, hard breaks dropped."""
    text = html.unescape(markdown).replace("\\", "").replace("\xa0", " ")
    return "\n".join(line.rstrip() for line in text.splitlines())


def _check_why_tab(s: AppState, j: dict) -> None:
    """The app's Why tab (per layer, or the whole graph) states the same facts as `--json`."""
    if not j["layers"]:
        why = _plain(s.why_graph())
        assert f"{len(j['misses'])} missed fusion(s)" in why
        return
    for d in j["layers"]:
        why = _plain(s.why_layer(d["layer"]))
        _check_said_no_here(why, s.advised_trace())
        blocks = _blocks(why.split("\n\n", 1)[1])
        assert len(blocks) == 1 and blocks[0][0] == d["status"], why
        want = {_miss_key(m) for m in d["misses"]} | {(o["rule"], o["guard"]) for o in d["rejections"]}
        if d["first"] is not None:
            want.add((d["first"]["rule"], d["first"]["guard"]))
        assert _text_facts(blocks[0][1]) == want, (why, want)


def _check_app_views(s: AppState, j: dict) -> int:
    """For every layer of the app's run: the session's verdict on the advised run (`layer_status`, every fix
    checked by its what-if) is what `--json` says, what the Why tab says, what the "why" drawing shows and what the
    node panel says for the first rejection's node (its decision's message and hint as `explain` words them). The
    layers checked."""
    by_layer = {d["layer"]: d for d in j["layers"]}
    trace = s.advised_trace()
    last = len(trace.versions()) - 1
    for layer in s.layers():
        st = layer_status(trace, layer)
        d = by_layer[layer]
        first = (st.first.rule, st.first.guard, st.first.fix) if st.first else None
        jf = d["first"]
        assert d["fused"] == (st.fused and not st.gap_only) and d["nothing_to_change"] == st.fused
        assert d["gap_only"] == st.gap_only and ((jf["rule"], jf["guard"], jf["compiler_fix"]) if jf else None) == first
        why = _plain(s.why_layer(layer))
        assert ("NOT fused" in why) == (not st.fused), why
        legal_only = st.fused and bool(st.illegal)  # issue 38: a product illegal for the layer is not expected
        assert (f"layer {layer}: fused as far as legal" in why) == legal_only, why
        assert (d["status"] == "fused as far as legal") == legal_only and len(d["illegal"]) == len(st.illegal)
        g, ov, _ = picture(trace, View(version=last, side="why", focus=layer))
        if st.first is None and st.gap_only:  # its first gap's place, drawn `△`: the node panel of its anchor
            assert verdict_pass(trace, layer) is None
            node = _check_gap_drawing(trace, layer, g, ov)
        elif st.first is None:
            assert verdict_pass(trace, layer) is None or not st.fused
            assert why_step(trace, layer) is None and g is trace.versions()[last][1]
            node = next(n.id for n in g if layer_of(n.path) == layer)
        else:
            assert f"first rejection: {st.first.rule}" in why and f"guard {st.first.guard} " in why
            assert (st.first.fix in why) if st.first.fix else True
            assert verdict_pass(trace, layer) == st.first.pass_name and g is trace.step(st.first.pass_name).before
            node = st.first.nodes[0] if st.first.nodes else st.first.subject
        rep = node_report(g, node, trace)
        v = rep["verdict"]
        assert v is not None and v["layer"] == layer, (layer, node, g[node].path)
        assert v["fused"] == st.fused and (v["rule"], v["guard"], v["fix"]) == (first or ("", "", ""))
        if st.first is not None:
            said = [x for x in rep["decisions"] if x["rule"] == st.first.rule and x["guard"] == st.first.guard]
            assert said and said[0]["message"] == st.first.message and said[0]["hint"] == st.first.hint
            text = _plain(report_markdown(rep))
            assert f"layer {layer}: NOT fused" in text and st.first.guard in text
        elif legal_only:
            assert f"layer {layer}: fused as far as legal" in _plain(report_markdown(rep))
        if st.gap_only:
            assert v["gaps"] == st.op_gaps and f"layer {layer}: {st.status}" in _plain(report_markdown(rep))
    return len(s.layers())


def _handed(capsys, monkeypatch, path: Path) -> None:
    code, text, j, trace = _explain(capsys, monkeypatch, path)
    v = _check_cli(code, text, j, trace)
    _check_drawing_and_panel(trace, v)
    s = AppState(runner=Runner(background=False), source="ir", ir_text=path.read_text())
    assert s.message_kind != "danger", s.message
    _check_why_tab(s, j)
    _check_app_views(s, j)


HANDED_REST = [p for p in HANDED if p not in HANDED_SAMPLE]
"""The handed cases the sample leaves out: with the sample (the fast tier), the sweep checks each case once."""


@pytest.mark.parametrize("path", HANDED_SAMPLE, ids=[p.stem for p in HANDED_SAMPLE])
def test_handed_case_every_form_one_verdict(capsys, monkeypatch, path):
    _handed(capsys, monkeypatch, path)


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("path", HANDED_REST, ids=[p.stem for p in HANDED_REST])
def test_every_handed_case_every_form_one_verdict(capsys, monkeypatch, path):
    _handed(capsys, monkeypatch, path)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_every_form_one_verdict(capsys, monkeypatch, name):
    code, text, j, trace = _explain(capsys, monkeypatch, name, "--seq", 8)
    _check_drawing_and_panel(trace, _check_cli(code, text, j, trace))
    s = AppState(runner=Runner(background=False), preset=name, seq=8)
    _check_why_tab(s, j)
    assert _check_app_views(s, j) >= 1


ONNX_SAMPLE = FIXTURES_SAMPLE + ZOO_SAMPLE
ONNX_REST = [p for p in FIXTURES + ZOO_SWEPT if p not in ONNX_SAMPLE]
"""The fixtures and swept zoo files the sample leaves out: with the sample (the fast tier), the sweep checks each
once."""


def _onnx(capsys, monkeypatch, path: Path) -> None:
    """Every form of `path`'s verdict, with the inputs and expected outputs that come with it (`clirun.file_inputs`)."""
    given = file_inputs(path)
    code, text, j, trace = _explain(capsys, monkeypatch, path, *(("--inputs", given["npz"]) if given else ()))
    _check_drawing_and_panel(trace, _check_cli(code, text, j, trace))
    _check_chips(trace)


def _check_chips(trace) -> None:
    """The app's version chips render for every version, each mark with its tooltip (starcoder2.ortopt's load
    raised `KeyError: 'taken later'` there while `explain` printed the file, newcomer run 27)."""
    rows = version_rows(trace, [(i, label) for i, (label, _) in enumerate(trace.versions())])
    chips = counts_html(rows, 0, lambda k: "")
    assert chips.count("class='rv-chip'") == len(trace.versions())
    for r in rows:
        assert (f"✗{r['rejections']}</span>" in chips) if r["rejections"] else True


@pytest.mark.parametrize("path", ONNX_SAMPLE, ids=[p.stem for p in ONNX_SAMPLE])
def test_onnx_every_form_one_verdict(capsys, monkeypatch, path):
    _onnx(capsys, monkeypatch, path)


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("path", ONNX_REST, ids=[p.stem for p in ONNX_REST])
def test_every_onnx_fixture_and_zoo_file_every_form_one_verdict(capsys, monkeypatch, path):
    _onnx(capsys, monkeypatch, path)


UPLOADED = [p for p in FIXTURES if p.stem in ("bert", "gpt2")]
"""ONNX files dropped on the app (each loaded and checked in child processes, ~6 s): the app's views of an upload
read the verdict `explain` prints for the file; every file's `explain` forms are checked above."""


@pytest.mark.parametrize("path", UPLOADED, ids=[p.stem for p in UPLOADED])
def test_an_uploaded_onnx_file_every_view_one_verdict(capsys, monkeypatch, path):
    code, text, j, trace = _explain(capsys, monkeypatch, path)
    _check_cli(code, text, j, trace)
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.load_upload({path.name: path.read_bytes()})
    assert s.message_kind != "danger", s.message
    _check_why_tab(s, j)
    assert _check_app_views(s, j) >= 1


def test_the_samples_and_the_sweeps_cover_every_file_once():
    assert sorted(HANDED_SAMPLE + HANDED_REST) == HANDED and len(HANDED_SAMPLE) == 10
    assert sorted(ONNX_SAMPLE + ONNX_REST) == sorted(set(FIXTURES + ZOO_SWEPT + ONNX_SAMPLE)) and len(ONNX_SAMPLE) == 8
    assert {p.stem.split(".")[0] for p in ZOO_SWEPT} == {p.stem.split(".")[0] for p in ZOO}  # every architecture
    assert {p.stem.split(".", 1)[1] for p in ZOO_SWEPT} == {p.stem.split(".", 1)[1] for p in ZOO}  # every form


def test_a_miss_only_in_json_fails_the_parity_check():
    """The check can fail: a text block that drops a miss `--json` lists is caught."""
    block = "layer 0: NOT fused (expected X)\n  first rejection: a.b\n    guard g (guard, illegal): m"
    assert _text_facts(block) == {("a.b", "g")}
    assert _text_facts(block) != {("a.b", "g"), ("c.d", "h")}
    assert _miss_key("c.d @ %3 (p.q): h [not recognized]: why -> fix") == ("c.d", "h")
    assert _miss_key("unrecognized.attention @ %20 (p): no_rule: softmax") == ("unrecognized.attention", "no_rule")


def _run(path: Path):
    """The canonical run of `path` as `explain` opens it (seq 8)."""
    from rlxviz.session import OpenRequest, open_model, open_pipeline, open_trace

    asked = OpenRequest(source=str(path), seq=8)
    return open_trace(open_model(asked).graph, asked, open_pipeline(asked))


def _messages(trace) -> str:
    """Every refusal's message as `explain -v`, `--json` and the app's table word it (`report.in_context`)."""
    from rlxviz.passes.report import in_context

    return "\n".join(in_context(trace, k, r)[0] for k, s in enumerate(trace.steps) for r in s.rejections)


SAID_FILES = HANDED + [p for p in FIXTURES if p.parent.name == "cases"] + [
    p for p in ZOO if p.stem in ("mobilebert.dynamo-eager", "mobilebert.optimum")]
"""Every handed case, the ONNX cases and the zoo files whose Why lines named a model's own term a gap: mobilebert's
attention (its V projected from another input than Q/K), like n3-09's cross-attention and n4-13's shared K/V."""


@pytest.mark.parametrize("path", SAID_FILES, ids=[p.stem for p in SAID_FILES])
def test_every_said_no_here_names_the_refusals_standing(path):
    """Every "said no here" clause of every refusal's message names the earlier refusal as its standing does."""
    _check_said_no_here(_messages(_run(path)), _run(path))


def test_the_cross_attention_why_line_says_the_models_own_term(capsys, monkeypatch):
    """n3-09 (a newcomer's finding): the Why tab's not-expected line called `self_attention` at the cross-attention
    `a gap in rlxviz's ops: cross-attention block` where the chips (`○1`), `explain -v` (`○ nothing to fix, the
    model's own term`), the footer and `--json` (no gap layer, no gap refusal) call it the model's own term, as
    bart-full's line does."""
    path = next(p for p in HANDED if p.stem == "n3-09-cross-attention")
    code, text, j, trace = _explain(capsys, monkeypatch, path)
    assert j["gap_layers"] == 0 and not j["layers"][0]["gap_refusals"], j["layers"][0]
    want = "fuse_attention_block ran before and said no here: self_attention (the model's own term): "
    assert want in text and "cross-attention block)" not in text.split("said no here", 1)[1], text
    s = AppState(runner=Runner(background=False), source="ir", ir_text=path.read_text())
    why = _plain(s.why_layer(0))
    assert want in why and _check_said_no_here(why, s.advised_trace()) >= 1, why  # its line and -v
    assert "said no here: self_attention (a gap" not in why


def test_a_gap_said_of_the_models_own_term_fails_the_check():
    """The check can fail: a clause calling n3-09's `self_attention` (○ the model's own term) a gap is caught."""
    trace = _run(next(p for p in HANDED if p.stem == "n3-09-cross-attention"))
    ok = "fuse_attention_block ran before and said no here: self_attention (the model's own term): Q"
    assert _check_said_no_here(ok, trace) == 1
    with pytest.raises(AssertionError):
        _check_said_no_here(ok.replace("the model's own term", "a gap in rlxviz's ops: cross-attention block"), trace)
