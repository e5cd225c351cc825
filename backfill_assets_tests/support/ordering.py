"""The order the suite's tests run in: the slow ones first on every worker.

pytest-xdist's ``worksteal`` hands worker ``i`` of ``k`` the next ``len(pending) // (k - i)``
tests of the collection, in order, and an idle worker then steals from the tail of a busy
one's share. With every slow test at the head of the collection, the first worker got all of
them (over half the suite's time) while the other ran the fast ones and stole fast ones back.
Here each worker's share starts with its part of the slow tests, dealt module by module (a
module's tests stay together: they share module fixtures such as a Spark cluster) in turn,
and ends with fast ones, which are what the stealing moves at the end."""

from __future__ import annotations

import os
from itertools import groupby

import pytest


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def shares(count: int, workers: int) -> list[int]:
    """How many tests of ``count`` worksteal first sends each of ``workers`` (in order)."""
    sizes, left = [], count
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def slow_first(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` reordered so each worker's first share starts with its part of the slow tests."""
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    fast = [i for i in items if i.get_closest_marker("slow") is None]
    if workers < 2:
        return slow + fast
    dealt: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for n, (_, group) in enumerate(groupby(slow, key=_module)):
        dealt[n % workers].extend(group)
    ordered: list[pytest.Item] = []
    end = 0
    for size, head in zip(shares(len(items), workers), dealt):
        end += size
        ordered.extend(head)
        take = max(0, end - len(ordered))  # a share longer in slow tests than its size takes none
        ordered.extend(fast[:take])
        del fast[:take]
    return ordered + fast


@pytest.hookimpl(trylast=True)  # after the markers are applied and -m and -k have deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = slow_first(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
