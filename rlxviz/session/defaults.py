"""The defaults every front end shares: the shapes a model is built for and the timing rounds.

The CLI (every subcommand that builds a model, and `rlxviz time`), the app (`AppState`) and
`session.load` read these, so a model opened without options is the same graph everywhere and
`rlxviz time MODEL` measures what the app's Timing tab measures.

Why these values:

* `DEFAULT_SEQ = 16`: the fusion decisions do not depend on the sequence length (the only shape rule,
  the attention gate on batch*seq, is off by default and the `over_threshold` variant raises the length
  itself), so a short sequence shows the same graph, draws and runs fast, and is what the notebooks use.
  Timing at this size is meaningful for what the fusions change on this runtime: with batch 1 and 16
  tokens MiniLM's versions take ~10 ms on an idle 2-core CPU, well above the timer's resolution, and
  the per-op work that fusion removes is a visible share of it. Measure large shapes explicitly
  (`--batch 8 --seq 128`, as docs/performance.md does).
* `DEFAULT_REPEAT = MIN_VERDICT_ROUNDS` (21) interleaved rounds after `DEFAULT_WARMUP = 2` untimed ones: the
  fewest paired rounds a faster/slower verdict is read from (with the 10 rounds of before, the app's Timing tab
  and `rlxviz time` never gave one), and every round times every version once, so a load spike hits all
  versions alike. 21 rounds of MiniLM's versions take about 2 s.
"""

from __future__ import annotations

DEFAULT_BATCH = 1
"""Batch size a model is built for."""

DEFAULT_SEQ = 16
"""Sequence length (tokens) a model is built for."""

MIN_VERDICT_ROUNDS = 21
"""Fewest paired rounds a faster/slower verdict is read from (with 7, a notebook printed "1.37x faster" in
1 of 9 runs where 41 paired rounds showed no difference, issue 23). `session.timing` reads its verdicts by it."""

DEFAULT_REPEAT = MIN_VERDICT_ROUNDS
"""Timed interleaved rounds (each round runs every version once): enough for a verdict."""

DEFAULT_WARMUP = 2
"""Untimed rounds after each version's first call."""

MAX_REPEAT = 1000
"""Most timed rounds one timing run may ask for (`rlxviz time --repeat`, the app's control, `time_versions`):
a bound, so a typo cannot start a run that never ends."""

MAX_WARMUP = 100
"""Most untimed warm-up rounds one timing run may ask for."""


def check_rounds(repeat: object, warmup: object) -> None:
    """Refuse timing rounds outside 1..MAX_REPEAT (`repeat`) and 0..MAX_WARMUP (`warmup`).

    Raises:
        SessionError: one line naming the bound.
    """
    from .errors import SessionError

    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise SessionError(f"repeat must be an integer in 1..{MAX_REPEAT}, got {str(repeat)[:40]}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= MAX_WARMUP:
        raise SessionError(f"warmup must be an integer in 0..{MAX_WARMUP}, got {str(warmup)[:40]}")


__all__ = ["DEFAULT_BATCH", "DEFAULT_REPEAT", "DEFAULT_SEQ", "DEFAULT_WARMUP", "MAX_REPEAT", "MAX_WARMUP",
           "MIN_VERDICT_ROUNDS", "check_rounds"]
