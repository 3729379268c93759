"""One wall-time watchdog for the fuzz tests: `within(seconds, what)` fails the test when its block runs longer."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


class Hang(BaseException):
    """Raised in the block at its deadline (a BaseException: the code under test's `except Exception` lets it
    through)."""


def _alarm(signum, frame):
    raise Hang


@contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Run the block under a SIGALRM timer of `seconds`; past it, `pytest.fail(f"{what} took over {seconds} s")`.
    The previous SIGALRM handler and a cleared timer are restored on the way out, whatever happens."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except Hang:
        pytest.fail(f"{what} took over {seconds:g} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
