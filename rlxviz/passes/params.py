"""Pipeline parameters: one frozen dataclass, so a misspelt parameter fails where it is given.

`Pipeline.params` stays a plain mapping of overrides (front ends build it from user input), but every place that
takes one (`Pipeline(...)`, `Pipeline.canonical(**params)`, `Pipeline.run(graph, params)`, `run_passes`,
`session.build_pipeline`) checks its keys against `PipelineParams`' fields. Before this, an open `dict[str, Any]`
took `{"fab_max_tokns": 1}` without a word, and because `guard.size_le` reads a missing parameter as "no gate", the
attention gate silently switched off. Guards name a parameter by its field (`size_le("fab_max_tokens", ...)`), and
`size_le` checks that name when the rule module is imported.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


class ParamError(KeyError):
    """An unknown pipeline parameter. `str()` is the one-line message (not `KeyError`'s quoted repr).

    Attributes:
        name: the unknown parameter.
        close: the known parameters it is close to (difflib), best first; empty when none is close.
    """

    def __init__(self, name: str, close: tuple[str, ...], where: str = "") -> None:
        self.name, self.close = name, close
        guess = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        at = f" (in {where})" if where else ""
        self.message = f"unknown pipeline parameter {name!r}{at}{guess} (known: {', '.join(PARAM_NAMES)})"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParams:
    """Every parameter a pass reads from its pipeline.

    Attributes:
        fab_max_tokens: batch*seq gate of `fuse_attention_block` (tokens); None = no gate (the `rlx` profile: 64).
        max_region_steps: most elementwise steps `mark_elementwise_regions` packs into one region (count).
        max_region_inputs: most distinct inputs of one region (count).
        merge_cost_test: True: `fuse_shared_input_matmul` never merges a matmul whose merge would cost a fusion.
        unfuse_ops: op names `unfuse` expands (None: every fused op).
    """

    fab_max_tokens: int | None = None
    max_region_steps: int = 32
    max_region_inputs: int = 16
    merge_cost_test: bool = True
    unfuse_ops: tuple[str, ...] | list[str] | None = None

    @classmethod
    def of(cls, params: Mapping[str, Any] | None, where: str = "") -> PipelineParams:
        """The parameters with `params` over the defaults.

        Raises:
            ParamError: a key that is no field, naming the close matches.
        """
        check_params(params or {}, where)
        return cls(**dict(params or {}))


PARAM_NAMES: tuple[str, ...] = tuple(f.name for f in fields(PipelineParams))
"""The known parameter names, in declaration order."""


def check_param(name: str, where: str = "") -> str:
    """`name`, if it is a `PipelineParams` field.

    Raises:
        ParamError: naming `where` and the close matches (`difflib.get_close_matches`).
    """
    if name not in PARAM_NAMES:
        raise ParamError(name, tuple(difflib.get_close_matches(str(name), PARAM_NAMES, n=2)), where)
    return name


def check_params(params: Mapping[str, Any], where: str = "") -> Mapping[str, Any]:
    """`params`, after checking every key with `check_param` (raises `ParamError` on the first unknown one)."""
    for k in params:
        check_param(k, where)
    return params


__all__ = ["PARAM_NAMES", "ParamError", "PipelineParams", "check_param", "check_params"]
