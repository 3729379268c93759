"""docs/debug.md's pasted runs are what the commands print now: every `$ rlxviz ...` of its console blocks (no
pipe) is run in-process, each pasted line (`...` marks lines left out) must be a line of its output, and the exit
code its comment states (`# exit 1`) must be the command's (a newcomer read "the epilogue allow-list (gelu, silu)"
there, from a run before `relu2` joined it)."""

from __future__ import annotations

import re
import shlex

import pytest
from clirun import ROOT, run

DOC = ROOT / "docs" / "debug.md"


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


def test_the_doc_has_the_runs_it_teaches_with():
    assert len(RUNS) >= 5
    assert any(args[:2] == ["explain", "bert-tiny"] and "tanh_gelu" in args for args, _, _ in RUNS)


@pytest.mark.parametrize(("args", "stated", "lines"), RUNS, ids=[" ".join(r[0]) for r in RUNS])
def test_pasted_output_is_what_the_command_prints(capsys, monkeypatch, args, stated, lines):
    monkeypatch.chdir(ROOT)  # the doc's paths are the repository's
    code, out, err = run(capsys, *args)
    printed = set((out + err).splitlines())
    assert stated is None or code == stated, (args, code)
    missing = [ln for ln in lines if ln not in printed]
    assert not missing, f"docs/debug.md: re-paste `rlxviz {' '.join(args)}`; not printed now: {missing[0][:160]}"
