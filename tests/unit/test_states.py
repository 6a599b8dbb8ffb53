"""The transition table as data: shape, reachability, and agreement with the schema."""

from __future__ import annotations

from collections import deque

import pytest

from hypermedia.db import schema
from hypermedia.queue import states


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {s: set() for s in states.STATUSES}
    for src, dst in states.ALLOWED:
        g[src].add(dst)
    return g


def _reachable(start: str) -> set[str]:
    g, seen, todo = _graph(), {start}, deque([start])
    while todo:
        for nxt in g[todo.popleft()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_statuses_are_unique_and_cover_seed_000():
    assert len(set(states.STATUSES)) == len(states.STATUSES)
    seed_000 = {
        "created",
        "queued",
        "claimed",
        "processing",
        "completed",
        "failed",
        "cancelled",
        "retry_wait",
    }
    assert seed_000 <= set(states.STATUSES)
    assert set(states.STATUSES) - seed_000 == {"cancel_requested", "paused"}  # seed 004


def test_every_action_names_known_statuses():
    for action, (sources, target) in states.TRANSITIONS.items():
        assert sources, action
        assert sources <= set(states.STATUSES), action
        assert target in states.STATUSES, action
        assert target not in sources, f"{action} would be a self-transition"


def test_allowed_is_exactly_the_table():
    expected = {(s, dst) for srcs, dst in states.TRANSITIONS.values() for s in srcs}
    assert expected == states.ALLOWED
    for src in states.STATUSES:
        for dst in states.STATUSES:
            assert states.is_allowed(src, dst) == ((src, dst) in expected)


def test_sources_and_target_helpers():
    assert states.sources("claim") == {"queued"}
    assert states.target("claim") == "claimed"
    assert states.sources("complete") == states.RUNNING_SIDE
    with pytest.raises(KeyError):
        states.sources("teleport")


def test_groups_partition_the_statuses():
    groups = [states.QUEUED_SIDE, states.RUNNING_SIDE, states.TERMINAL]
    assert not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])
    assert set().union(*groups) == set(states.STATUSES)


def test_every_status_is_reachable_from_creation():
    assert _reachable("created") == set(states.STATUSES)


def test_every_status_can_end():
    for status in states.STATUSES:
        assert _reachable(status) & states.TERMINAL, status


def test_terminal_states_leave_only_by_explicit_retry():
    for src, dst in states.ALLOWED:
        if src in states.TERMINAL:
            assert src in states.sources("retry") and dst == "queued", (src, dst)
    assert ("completed", "queued") not in states.ALLOWED


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("completed", "cancelled"),
        ("queued", "completed"),
        ("queued", "processing"),
        ("created", "claimed"),
        ("retry_wait", "claimed"),
        ("cancelled", "completed"),
        ("failed", "retry_wait"),
        ("processing", "queued"),
        ("cancel_requested", "processing"),
    ],
)
def test_some_pairs_are_forbidden(src, dst):
    assert not states.is_allowed(src, dst)


def test_design_lifecycle_edges_are_allowed():
    # DESIGN.md section 3, line by line.
    for edge in [
        ("created", "queued"),
        ("queued", "claimed"),
        ("claimed", "processing"),
        ("processing", "completed"),
        ("processing", "cancel_requested"),
        ("cancel_requested", "cancelled"),
        ("cancel_requested", "completed"),
        ("cancel_requested", "failed"),
        ("processing", "paused"),
        ("paused", "queued"),
        ("paused", "cancelled"),
        ("processing", "retry_wait"),
        ("retry_wait", "queued"),
        ("processing", "failed"),
        ("claimed", "retry_wait"),
        ("claimed", "failed"),
        ("queued", "cancelled"),
        ("created", "cancelled"),
        ("retry_wait", "cancelled"),
        ("failed", "queued"),
        ("cancelled", "queued"),
    ]:
        assert states.is_allowed(*edge), edge


def test_legacy_view_covers_every_status():
    assert set(states.LEGACY_STATUS) == set(states.STATUSES)
    assert set(states.LEGACY_STATUS.values()) == {
        "pending",
        "running",
        "completed",
        "failed",
        "cancelled",
    }
    assert {s for s, v in states.LEGACY_STATUS.items() if v == "running"} == {
        "processing",
        "cancel_requested",
    }
    for s in states.TERMINAL:
        assert states.LEGACY_STATUS[s] == s


def _check_text(table, name: str) -> str:
    for c in table.constraints:
        if getattr(c, "name", None) == f"ck_{table.name}_{name}":
            return str(c.sqltext)
    raise AssertionError(f"no constraint {name}")


def test_schema_checks_list_exactly_the_known_values():
    jobs = _check_text(schema.processing_jobs, "status")
    for s in states.STATUSES:
        assert f"'{s}'" in jobs
    assert jobs.count("'") == 2 * len(states.STATUSES)
    att = _check_text(schema.job_attempts, "status")
    assert att.count("'") == 2 * len(states.ATTEMPT_STATUSES)
    outcome = _check_text(schema.processing_jobs, "outcome")
    assert all(f"'{o}'" in outcome for o in states.OUTCOMES)
