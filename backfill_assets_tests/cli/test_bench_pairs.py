"""The benchmark's ratios (benchmarks/pairs.py): the median of alternated pairs, so that one
slow run on either side does not move a figure."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "pairs.py"
_SPEC = importlib.util.spec_from_file_location("bench_pairs", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
pairs = sys.modules["bench_pairs"] = importlib.util.module_from_spec(_SPEC)  # its dataclass looks itself up
_SPEC.loader.exec_module(pairs)


def test_the_median_pair_is_reported_and_the_order_alternates():
    order: list[str] = []
    naive_s = iter([2.0, 2.0, 9.0])  # the third naive run is an outlier (a checkpoint landed on it)
    ours_s = iter([6.0, 7.0, 6.0])

    def naive() -> float:
        order.append("naive")
        return next(naive_s)

    def ours() -> tuple[float, str]:
        order.append("ours")
        value = next(ours_s)
        return value, f"run {len(order)}"

    paired = pairs.alternated(3, naive, ours)
    assert order == ["naive", "ours", "ours", "naive", "naive", "ours"]
    assert paired.ratios == (3.0, 3.5, 6.0 / 9.0)
    # The median pair: 3.0x (the outlier pair, 0.67x, and the slow one, 3.5x, are left out).
    assert (paired.ours, paired.naive, paired.ratio, paired.detail) == (6.0, 2.0, 3.0, "run 2")
    assert paired.spread() == "median of 3 alternated pair(s) (0.67x, 3.00x, 3.50x)"


@pytest.mark.parametrize("count", [0, 2, -1])
def test_an_even_or_empty_count_is_refused(count):
    with pytest.raises(ValueError, match="odd number"):
        pairs.alternated(count, lambda: 1.0, lambda: (1.0, None))
