"""docs/onnx.md's Examples section pastes `rlxviz explain` outputs: each `$ rlxviz explain ...` line of its console
blocks is re-run in-process and must print the pasted text (a `...` line stands for one or more skipped lines) with
the exit status its `# exit N` comment states, so a newcomer reading the docs sees what the CLI prints today."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from clirun import ROOT, run

pytestmark = pytest.mark.sweep  # five explains of small exports and MiniLM: ~15 s in all

DOC = ROOT / "docs" / "onnx.md"
SECTION = "## Examples: explain an export"
MINILM = "/tmp/minilm/"
"""The folder the doc's two `cp` lines fill with minilm.onnx and its weights; the test builds its own."""


def doc_examples(text: str) -> list[tuple[str, int, list[str]]]:
    """(command line after `$ `, stated exit status, pasted output lines) of each `$ rlxviz explain` in the console
    blocks of the Examples section of `text`."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else len(text)]
    examples: list[tuple[str, int, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
            if not chunk.startswith("$ rlxviz explain"):
                continue
            head, *body = chunk.rstrip("\n").split("\n")
            m = re.fullmatch(r"\$ (rlxviz explain .*?)\s+# exit (\d+)", head)
            assert m, f"docs/onnx.md: no `# exit N` on {head!r}"
            examples.append((m.group(1), int(m.group(2)), body))
    return examples


FIGURE = re.compile(r"\b\d(?:\.\d+)?e[-+]\d\d\b")
"""A measured error figure (`max err 3.6e-07`): its last digits follow the machine's BLAS and vector width (AVX2,
AVX-512), so the pastes are compared with every such figure read as one token; the words around it are compared."""


def same_line(want: str, got: str) -> bool:
    """Whether two lines read the same, measured error figures aside (`FIGURE`)."""
    return FIGURE.sub("<err>", want) == FIGURE.sub("<err>", got)


def matches(want: list[str], got: list[str]) -> bool:
    """Whether `got` reads as `want`, where a `...` line of `want` stands for one or more lines of `got`."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[k:]) for k in range(1, len(got) + 1))
    return bool(got) and same_line(want[0], got[0]) and matches(want[1:], got[1:])


def test_matches_reads_elisions():
    """`...` stands for at least one skipped line, and every other line must be equal."""
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert not matches(["a", "...", "d"], ["a", "d"])
    assert not matches(["a", "d"], ["a", "b"])
    assert not matches(["a"], ["a", "b"])
    assert matches(["max err 3.6e-07 on y"], ["max err 3.9e-07 on y"])  # a figure: the machine's last digits
    assert not matches(["max err 3.6e-07 on y"], ["max err 3.6e-07 on z"])


def test_doc_parses_every_example():
    """The section has the five pasted explains (bert, minilm, gpt2, llama, vit), each with output."""
    examples = doc_examples(DOC.read_text())
    names = [Path(shlex.split(cmd)[2]).stem for cmd, _, _ in examples]
    assert names == ["bert", "minilm", "gpt2", "llama", "vit"], names
    assert all(body for _, _, body in examples)


@pytest.fixture(scope="module")
def minilm_folder(tmp_path_factory) -> Path:
    """A folder holding minilm.onnx next to the installed package's weights, as the doc's `cp` lines make."""
    import shutil

    from rlxviz.models import minilm_dir

    folder = tmp_path_factory.mktemp("minilm")
    (folder / "minilm.onnx").write_bytes((ROOT / "tests" / "fixtures" / "onnx" / "minilm.onnx").read_bytes())
    # a copy, as the doc's `cp`: the loader refuses a symlink out of the folder, and ONNX refuses a hard-linked file
    shutil.copyfile(Path(minilm_dir()) / "model.safetensors", folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("index", range(5))
def test_pasted_explain_is_what_the_cli_prints(index, capsys, monkeypatch, minilm_folder):
    """The pasted output of example `index` equals what `rlxviz explain` prints now, with the stated exit status."""
    monkeypatch.chdir(ROOT)
    cmd, want_code, want = doc_examples(DOC.read_text())[index]
    args = [a.replace(MINILM, f"{minilm_folder}/") for a in shlex.split(cmd)[1:]]
    code, out, err = run(capsys, *args)
    assert not err, err
    got = out.rstrip("\n").split("\n")
    assert matches(want, got), f"docs/onnx.md's paste of `{cmd}` is stale; the CLI prints:\n{out}"
    assert code == want_code, f"`{cmd}` exits {code}, the doc says {want_code}"
