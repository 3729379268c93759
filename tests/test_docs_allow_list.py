"""The epilogue allow-list as the prose states it: every list of activations written near "allow-list" in the docs,
the README and the notebooks' sources is the one table `rlxviz.ir.ops.EPILOGUE_ACTIVATIONS` (a newcomer read
"takes `gelu` and `silu` only" in notebook 05 and docs/debug.md, after `relu2` had joined it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlxviz.ir.ops import ACTIVATIONS, EPILOGUE_ACTIVATIONS

ROOT = Path(__file__).resolve().parent.parent
PROSE = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks" / "src").glob("*.py")])
NAME = "|".join(sorted((re.escape(a.value) for a in ACTIVATIONS), key=len, reverse=True))
LISTED = re.compile(rf"`?\b(?:{NAME})\b`?(?:(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+)`?\b(?:{NAME})\b`?)+")
"""Two or more activation names in a row: `gelu, silu`, `gelu` and `silu`, gelu, silu and relu2."""
NEAR = 80
"""How far from "allow-list" (characters, either side) a list is taken as the allow-list's."""
RLX_OWN = re.compile(r"RLX(?::|'s own)\s*$")
"""A list introduced as RLX's own (`RLX: gelu, silu`): RLX's allow-list, not rlxviz's."""


def allow_lists(text: str) -> list[tuple[int, list[str]]]:
    """(offset, names) of each list of activations within `NEAR` characters of an "allow-list", but not one
    introduced as RLX's own."""
    out = []
    for m in LISTED.finditer(text):
        window = text[max(0, m.start() - NEAR):m.end() + NEAR].replace("\n#", " ").replace("\n", " ")
        if "allow-list" not in window or RLX_OWN.search(text[max(0, m.start() - 20):m.start()]):
            continue
        out.append((m.start(), re.findall(rf"\b(?:{NAME})\b", m.group())))
    return out


def test_the_scan_finds_a_stale_list_and_passes_the_true_one():
    epilogue = [a.value for a in EPILOGUE_ACTIVATIONS]
    assert allow_lists("the epilogue allow-list (`gelu`, `silu`). More.") == [(25, ["gelu", "silu"])]
    assert allow_lists("(only `gelu` and `silu` are in its allow-list)")[0][1] == ["gelu", "silu"]
    assert allow_lists(f"allow-list `{'`, `'.join(epilogue)}` (RLX: `gelu`, `silu`)") == [(11, epilogue)]
    assert allow_lists("gelu and silu are activations.") == []


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_allow_list_in_the_prose_is_the_code_s(path):
    text = path.read_text(encoding="utf-8")
    want = sorted(a.value for a in EPILOGUE_ACTIVATIONS)
    for at, names in allow_lists(text):
        line = text.count("\n", 0, at) + 1
        assert sorted(names) == want, f"{path.relative_to(ROOT)}:{line} lists the epilogue allow-list as {names}; " \
                                      f"ir.ops.EPILOGUE_ACTIVATIONS is {want}"
