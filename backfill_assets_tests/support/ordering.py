"""The order the suite's tests run in: the slow ones first on every worker.

pytest-xdist's ``worksteal`` hands worker ``i`` of ``k`` the next ``len(pending) // (k - i)``
tests of the collection, in order, and an idle worker then steals from the tail of a busy
one's share. With every slow test at the head of the collection, the first worker got all of
them (over half the suite's time) while the other ran the fast ones and stole fast ones back.
Here each worker's share starts with its part of the slow tests, dealt module by module, the
longest first to the worker with the least so far (a module's tests stay together, as do the
tests of one ``xdist_group``: they share fixtures such as the session's Spark cluster), and
ends with fast ones, which are what the stealing moves at the end."""

from __future__ import annotations

import os

import pytest

# About how long each group of slow tests takes on two cores (seconds, from the suite's
# --durations): only how they are dealt depends on it, and a group missing here counts as
# DEFAULT_SECONDS.
SECONDS = {
    "group:spark_cluster": 250,
    "backfill_assets_tests/reliability/test_bounded_waits.py": 175,
    "backfill_assets_tests/dagster_layer/test_ui_end_to_end.py": 90,
    "backfill_assets_tests/dagster_layer/test_parallel.py": 60,
    "backfill_assets_tests/core/engines/spark/test_spark_atomic.py": 45,
    "backfill_assets_tests/core/engines/spark/test_spark_bad_inputs.py": 35,
    "backfill_assets_tests/core/profile/test_profile_engines.py": 26,
    "backfill_assets_tests/cli/test_ui.py": 12,
}
DEFAULT_SECONDS = 30


def _group(item: pytest.Item) -> str:
    """What stays on one worker: the ``xdist_group`` a test is marked with (tests sharing a
    session resource, such as the Spark cluster), else its module."""
    marker = item.get_closest_marker("xdist_group")
    return f"group:{marker.args[0]}" if marker is not None else item.nodeid.split("::", 1)[0]


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
    groups: dict[str, list[pytest.Item]] = {}
    for item in slow:
        groups.setdefault(_group(item), []).append(item)
    dealt: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0] * workers
    for name, group in sorted(groups.items(), key=lambda g: -SECONDS.get(g[0], DEFAULT_SECONDS)):
        least = load.index(min(load))  # the longest group first, to the worker with the least
        dealt[least].extend(group)
        load[least] += SECONDS.get(name, DEFAULT_SECONDS)
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
