"""The docs' pasted `explain` runs are what the command prints now: every `$ rlxviz explain ...` of the console
blocks of docs/debug.md, docs/passes.md and docs/teach-and-debug.md (no pipe) is run in-process, each pasted line
(`...` marks lines left out) must be a line of its output, and the exit code its comment states (`# exit 1`) must
be the command's (a newcomer read "the epilogue allow-list (gelu, silu)" in debug.md, from a run before `relu2`
joined it; passes.md kept a tanh-GELU run's words after the command's changed). `time` runs measure, and the other
commands' pastes name files of the reader's: they are not compared."""

from __future__ import annotations

import re
import shlex

import pytest
from clirun import ROOT, run

DOC = ROOT / "docs" / "debug.md"
DOCS = ("debug.md", "passes.md", "teach-and-debug.md")


def pasted_runs(text: str) -> list[tuple[list[str], int | None, list[str]]]:
    """(arguments after `rlxviz`, the exit code its comment states or None, pasted lines) of each command of the
    console blocks of `text` that has no pipe."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
            if not chunk.startswith("$ rlxviz "):
                continue
            command, *lines = chunk.rstrip("\n").splitlines()
            stated = re.search(r"#\s*exit (\d)", command)
            args = shlex.split(command[2:], comments=True)
            if "|" not in args:
                out.append((args[1:], int(stated.group(1)) if stated else None,
                            [ln for ln in lines if ln.strip() not in ("", "...")]))
    return out


RUNS = pasted_runs(DOC.read_text(encoding="utf-8"))
EXPLAIN_RUNS = [(doc, *r) for doc in DOCS for r in pasted_runs((ROOT / "docs" / doc).read_text(encoding="utf-8"))
                if r[0][0] == "explain"]


def test_the_doc_has_the_runs_it_teaches_with():
    assert len(RUNS) >= 5
    assert any(args[:2] == ["explain", "bert-tiny"] and "tanh_gelu" in args for args, _, _ in RUNS)


def test_every_doc_pastes_explain_runs():
    assert {doc for doc, *_ in EXPLAIN_RUNS} == set(DOCS)


@pytest.mark.parametrize(("doc", "args", "stated", "lines"), EXPLAIN_RUNS,
                         ids=[f"{r[0]}: {' '.join(r[1])}" for r in EXPLAIN_RUNS])
def test_pasted_output_is_what_the_command_prints(capsys, monkeypatch, doc, args, stated, lines):
    monkeypatch.chdir(ROOT)  # the doc's paths are the repository's
    code, out, err = run(capsys, *args)
    printed = set((out + err).splitlines())
    assert stated is None or code == stated, (args, code)
    missing = [ln for ln in lines if ln not in printed]
    assert not missing, f"docs/{doc}: re-paste `rlxviz {' '.join(args)}`; not printed now: {missing[0][:160]}"
