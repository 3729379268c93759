"""A sample of the zoo that keeps every architecture and every export form: the sweeps whose property holds per
kind of graph run it in `make test`, and every file with `RLXVIZ_SWEEP=all`."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def every_architecture_and_form(paths: list[Path]) -> list[Path]:
    """One file per architecture (the stem before the first dot), each the architecture's file in its rarest form
    (`kv`, `fp16`, `qdq`, ... before `dynamo-eager`), then one more file for any form no pick covered; sorted.

    138 zoo files -> 54 (one per architecture), covering all 11 forms."""
    forms = Counter(p.stem.split(".", 1)[1] for p in paths)
    by_arch: dict[str, list[Path]] = {}
    for p in sorted(paths):
        by_arch.setdefault(p.stem.split(".", 1)[0], []).append(p)
    picked = {min(files, key=lambda p: (forms[p.stem.split(".", 1)[1]], p.stem)) for files in by_arch.values()}
    covered = {p.stem.split(".", 1)[1] for p in picked}
    for p in sorted(paths):
        if p.stem.split(".", 1)[1] not in covered:
            picked.add(p)
            covered.add(p.stem.split(".", 1)[1])
    return sorted(picked)


def zoo_files() -> list[Path]:
    """The zoo files a sweep runs: every one with `RLXVIZ_SWEEP=all`, else `every_architecture_and_form`."""
    files = sorted(ZOO.glob("*.onnx"))
    return files if os.environ.get("RLXVIZ_SWEEP") == "all" else every_architecture_and_form(files)
