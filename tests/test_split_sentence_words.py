"""The split sentence under the "Fusion or kernels?" table says a ratio's verdict where it is no speed-up: a newcomer
read "rlxviz's kernels on the same fused graph 1.19x" as settled while the row above it said "1.19x (0.99-1.26)
within noise" (`lowerings.FusionAndKernels.sentence`)."""

from types import SimpleNamespace

from rlxviz.session.lowerings import FusionAndKernels


def split(total: tuple[float, str], fusion: tuple[float, str], kernels: tuple[float, str]) -> str:
    v = [SimpleNamespace(ratio=r, words=w) for r, w in (total, fusion, kernels)]
    return FusionAndKernels(rows=[], total=v[0], fusion=v[1], kernels=v[2], warning="", kernels_note="").sentence()


def test_a_ratio_within_noise_says_so_beside_it():
    words = split((1.04 * 1.19, "1.24x faster"), (1.04, "within noise"), (1.19, "within noise"))
    assert "over the input" in words and "1.24x over" in words and "1.24x (" not in words
    assert "gives 1.04x (within noise)" in words and "fused graph 1.19x (within noise)" in words, words


def test_too_few_rounds_for_all_three_is_said_once():
    few = "too few rounds (10 < 21) for a verdict"
    words = split((0.97 * 3.07, few), (0.97, few), (3.07, few))
    assert words.endswith(f"; none of the three is a verdict: {few}.") and words.count(few) == 1, words
    assert "3.07x: 0.97 x 3.07 = 2.98," in words, words


def test_three_verdicts_read_as_they_are():
    words = split((3.0, "3.00x faster"), (1.5, "1.50x faster"), (2.0, "2.00x faster"))
    assert "faster)" not in words and "1.50x and" in words and "graph 2.00x:" in words, words
