"""A ratio as the median of alternated pairs: ours and the naive way run one after the other,
``pairs`` times, the order swapped from one pair to the next (naive first, then ours first), so
that one noisy run, a cold cache or a checkpoint that lands on one side cannot move a figure.
The figure is the median pair: the pairs sorted by their ratio, the middle one (an odd number of
pairs, so the median is a pair that ran, and its seconds and details are that pair's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Paired(Generic[T]):
    """The median pair: ours and the naive way's seconds, their ratio, what ours returned; and
    every pair's ratio, in the order they ran."""

    ours: float
    naive: float
    detail: T
    ratios: tuple[float, ...]

    @property
    def ratio(self) -> float:
        return self.ours / self.naive

    def spread(self) -> str:
        """``median of 3 alternated pairs (3.02x, 3.10x, 3.31x)``."""
        return (f"median of {len(self.ratios)} alternated pair(s) ("
                + ", ".join(f"{r:.2f}x" for r in sorted(self.ratios)) + ")")


def alternated(pairs: int, naive: Callable[[], float], ours: Callable[[], tuple[float, T]]) -> Paired[T]:
    """Run ``naive`` and ``ours`` (each from the same starting state, which they set up
    themselves) in ``pairs`` alternated pairs; the median pair. ``ours`` returns its seconds and
    a detail kept for the median pair. The last run is always ours (the last pair is an odd
    one: naive, then ours), so the state it leaves is there for what follows."""
    if pairs < 1 or pairs % 2 == 0:
        raise ValueError(f"pairs must be an odd number of at least 1, not {pairs}")
    runs: list[tuple[float, float, T]] = []
    for i in range(pairs):
        if i % 2 == 0:
            n = naive()
            o, detail = ours()
        else:
            o, detail = ours()
            n = naive()
        runs.append((o, n, detail))
        print(f"   pair {i + 1}/{pairs}: ours {o:.2f} s, naive {n:.2f} s, {o / n:.2f}x", flush=True)
    ratios = tuple(o / n for o, n, _ in runs)
    o, n, detail = sorted(runs, key=lambda r: r[0] / r[1])[pairs // 2]
    return Paired(o, n, detail, ratios)
