"""Profiles: versions created, listed, shown, deactivated (never deleted), settings
checked against the job type's schema, and outputs recording their version."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from hypermedia.errors import InvalidRequest, NotFound
from hypermedia.pipelines import registry, schema
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob, Output
from hypermedia.queue.profiles import Prices, Profiles
from tests.conftest import BACKENDS

from ._helpers import W1, claim_one, done, job_row, outputs, race

RESIZE = {
    "width": schema.Field(int, 200, low=16, high=4096),
    "quality": schema.Field(int, 80, low=1, high=100),
    "format": schema.Field(str, "webp", choices=("webp", "jpeg", "png")),
    "max_pixels": schema.Field(int, 100_000_000, low=1, overridable=False),
}


def _run(params: dict[str, Any], ctx: registry.Context) -> dict[str, Any] | None:
    return None


@pytest.fixture
def resize(monkeypatch: pytest.MonkeyPatch) -> str:
    """A job type with a settings schema, registered for this test only."""
    registry.known()  # load the built-ins first: registering one must not stop them
    p = registry.Pipeline("test.resize", "images", schema.validator(RESIZE), _run, schema=RESIZE)
    monkeypatch.setitem(registry._REGISTRY, p.job_type, p)
    return p.job_type


def _key() -> str:
    # Profiles survive between tests (never deleted): each test its own keys.
    return f"t-{uuid.uuid4().hex[:12]}"


def test_versions_are_numbered_and_the_newest_active_one_wins(engine: Engine, resize: str):
    profiles, key = Profiles(engine), _key()
    v1 = profiles.create(key, resize, {"width": 300})
    v2 = profiles.create(key, resize, {"width": 400}, credits=Prices(2, 1, 0, 0))
    assert (v1["ref"], v2["ref"]) == (f"{key}:v1", f"{key}:v2")
    # Stored completed with the schema's defaults.
    assert v1["settings"] == {"width": 300, "quality": 80, "format": "webp", "max_pixels": 10**8}
    assert v1["queue_name"] == "images" and v1["timeout_seconds"] == 3600
    assert (v2["credit_cost_base"], v2["credit_cost_per_mb"]) == (2, 1)
    assert profiles.show(key)["ref"] == f"{key}:v2"
    assert profiles.show(f"{key}:v1")["settings"]["width"] == 300

    job = engine.enqueue(NewJob(resize, profile=key))
    assert engine.get(job)["params"]["width"] == 400
    pinned = engine.enqueue(NewJob(resize, {"quality": 50}, profile=f"{key}:v1"))
    assert engine.get(pinned)["params"] == {**v1["settings"], "quality": 50}


def test_a_new_version_carries_over_what_it_does_not_set(engine: Engine, resize: str):
    """Prices, queue, timeout and limit are never reset by omission; settings are whole."""
    profiles, key = Profiles(engine), _key()
    profiles.create(
        key,
        resize,
        {"width": 300},
        queue="bulk",
        credits=Prices(3, 2, 1, 0),
        timeout_seconds=60,
        max_input_bytes=1000,
    )
    v2 = profiles.create(key, resize, {"quality": 60})
    assert (v2["queue_name"], v2["timeout_seconds"], v2["max_input_bytes"]) == ("bulk", 60, 1000)
    assert [v2[c] for c in ("credit_cost_base", "credit_cost_per_mb", "credit_cost_per_page")] == [
        3,
        2,
        1,
    ]
    assert v2["settings"]["width"] == 200  # the schema's default, not v1's 300
    v3 = profiles.create(key, resize, {}, credits={"base": 9, "per_page": None})
    assert (v3["credit_cost_base"], v3["credit_cost_per_mb"], v3["credit_cost_per_page"]) == (
        9,
        2,
        1,
    )
    with pytest.raises(InvalidRequest, match="unknown prices: per_gb"):
        profiles.create(key, resize, {}, credits={"per_gb": 1})
    # Settings left out (None) carry over too: a new price only (it reset
    # them to the schema's defaults); {} asks for the defaults.
    v4 = profiles.create(key, resize, {"width": 111, "quality": 50})
    v5 = profiles.create(key, resize, None, credits={"base": 4})
    assert v5["settings"] == v4["settings"] and v5["settings"]["width"] == 111
    assert v5["credit_cost_base"] == 4
    fresh = profiles.create(_key(), resize, None)
    assert fresh["settings"] == profiles.create(_key(), resize, {})["settings"]


def test_version_numbers_follow_the_highest_not_the_count(engine: Engine, driver):
    key = _key()
    with driver.tx() as tx:
        for version in ("v1", "v9"):
            tx.insert_profile(
                {
                    "profile_key": key,
                    "profile_version": version,
                    "job_type": "debug.sleep",
                    "queue_name": "bulk",
                    "settings": {},
                    "credit_cost_base": 0,
                }
            )
    assert Profiles(engine).create(key, "debug.sleep", {})["ref"] == f"{key}:v10"


def test_list_filters_by_type_and_hides_inactive_versions(engine: Engine, resize: str):
    profiles, key = Profiles(engine), _key()
    profiles.create(key, resize, {})
    profiles.create(key, resize, {})
    profiles.deactivate(f"{key}:v1")
    mine = [p["ref"] for p in profiles.list(resize) if p["profile_key"] == key]
    assert mine == [f"{key}:v2"]
    everything = [p for p in profiles.list(resize, include_inactive=True)]
    assert [(p["ref"], p["is_active"]) for p in everything if p["profile_key"] == key] == [
        (f"{key}:v1", False),
        (f"{key}:v2", True),
    ]
    assert all(p["job_type"] == resize for p in everything)
    assert {"debug-noop:v1", "debug-sleep:v1"} <= {p["ref"] for p in profiles.list()}


def test_deactivated_versions_are_kept_and_refused_to_new_jobs(engine: Engine, resize: str):
    profiles, key = Profiles(engine), _key()
    profiles.create(key, resize, {"width": 100})
    profiles.create(key, resize, {"width": 200})
    old = engine.enqueue(NewJob(resize, profile=f"{key}:v2"))

    # A bare key is refused: it retired one more version at each repeat.
    with pytest.raises(InvalidRequest, match=f"name the version.*{key}:v2 is the newest"):
        profiles.deactivate(key)
    assert profiles.show(f"{key}:v2")["is_active"] is True
    gone = profiles.deactivate(f"{key}:v2")
    assert (gone["ref"], gone["is_active"]) == (f"{key}:v2", False)
    assert profiles.show(f"{key}:v2")["is_active"] is False  # kept, never deleted
    assert profiles.show(key)["ref"] == f"{key}:v1"
    assert engine.get(engine.enqueue(NewJob(resize, profile=key)))["params"]["width"] == 100
    with pytest.raises(InvalidRequest, match="deactivated"):
        engine.enqueue(NewJob(resize, profile=f"{key}:v2"))
    assert engine.get(old)["status"] == "queued"  # jobs already made keep their version

    # The last active version may go too; new jobs are then refused, clearly.
    profiles.deactivate(f"{key}:v1")
    assert profiles.deactivate(f"{key}:v1")["is_active"] is False  # again: no change, no error
    with pytest.raises(InvalidRequest, match="has no active version"):
        engine.enqueue(NewJob(resize, profile=key))
    with pytest.raises(NotFound, match="no active version"):
        profiles.show(key)
    assert len(profiles.list(resize, include_inactive=True)) >= 2
    # A new version brings the key back.
    assert profiles.create(key, resize, {})["ref"] == f"{key}:v3"
    assert engine.enqueue(NewJob(resize, profile=key))


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"width": 100_000}, "width must be from 16 to 4096"),
        ({"quality": 500}, "quality must be from 1 to 100"),
        ({"quality": "high"}, "quality must be an integer"),
        ({"format": "bmp"}, "format must be one of webp, jpeg, png"),
        ({"colour": "red"}, "unknown settings: colour"),
    ],
)
def test_settings_are_checked_against_the_schema(engine: Engine, resize: str, settings, reason):
    key = _key()
    with pytest.raises(InvalidRequest, match=reason):
        Profiles(engine).create(key, resize, settings)
    assert not [p for p in Profiles(engine).list(include_inactive=True) if p["profile_key"] == key]


@pytest.mark.parametrize("settings", [{"quality": 500}, {"size": 100_000}])
def test_image_thumbnail_refuses_absurd_settings(engine: Engine, settings):
    """A 100,000-pixel thumbnail or quality 500 never becomes a profile version."""
    with pytest.raises(InvalidRequest, match=r"image\.thumbnail"):
        Profiles(engine).create(_key(), "image.thumbnail", settings)


@pytest.mark.parametrize(
    ("job_type", "settings", "reason"),
    [
        ("pdf.preview", {"first_page": 5, "last_page": 2}, "pdf.preview"),
        ("security.virus_scan", {"clamd": "http://clamd.internal:3310"}, "security.virus_scan"),
    ],
)
def test_settings_the_pipeline_refuses_across_fields_never_become_a_version(
    engine: Engine, job_type: str, settings: dict, reason: str
):
    """Each field in its range, together refused: the version would have been
    the newest active one and failed every job enqueued with it."""
    key = _key()
    with pytest.raises(InvalidRequest, match=reason):
        Profiles(engine).create(key, job_type, settings)
    assert not [p for p in Profiles(engine).list(include_inactive=True) if p["profile_key"] == key]


def test_bad_creates_are_refused(engine: Engine, resize: str):
    profiles, key = Profiles(engine), _key()
    bad = {
        "unknown job type": lambda: profiles.create(key, "no.such_type", {}),
        "bad key": lambda: profiles.create("Bad Key!", resize, {}),
        "bad queue": lambda: profiles.create(key, resize, {}, queue="no spaces"),
        "negative price": lambda: profiles.create(key, resize, {}, credits=Prices(-1)),
        "zero timeout": lambda: profiles.create(key, resize, {}, timeout_seconds=0),
        "not an object": lambda: profiles.create(key, resize, [1, 2]),  # type: ignore[arg-type]
    }
    for what, call in bad.items():
        with pytest.raises(InvalidRequest):
            call()
            pytest.fail(f"{what} was accepted")
    profiles.create(key, resize, {})
    with pytest.raises(InvalidRequest, match=f"profile {key} is for {resize}"):
        profiles.create(key, "debug.sleep", {})


def test_references_must_be_key_or_key_vn(engine: Engine):
    # Surrounding blanks too: a reference is matched as given, as ids are
    # (" debug-sleep\n" named debug-sleep).
    bad = (
        "debug-sleep:2",
        "debug-sleep:v0",
        "debug-sleep:",
        "UPPER",
        "",
        " debug-sleep",
        "debug-sleep\n",
    )
    for ref in bad:
        with pytest.raises(InvalidRequest):
            Profiles(engine).show(ref)
    with pytest.raises(NotFound):
        Profiles(engine).show("debug-sleep:v99")


def test_job_params_override_only_what_the_profile_allows(engine: Engine, resize: str):
    key = _key()
    Profiles(engine).create(key, resize, {"max_pixels": 1000})
    with pytest.raises(InvalidRequest, match="set by the profile"):
        engine.enqueue(NewJob(resize, {"max_pixels": 10**9}, profile=key))
    with pytest.raises(InvalidRequest, match="quality must be from 1 to 100"):
        engine.enqueue(NewJob(resize, {"quality": 500}, profile=key))


def test_outputs_record_the_profile_version_that_made_them(engine: Engine, driver):
    profiles, key = Profiles(engine), _key()
    profiles.create(key, "debug.sleep", {"max_ms": 10})
    profiles.create(key, "debug.sleep", {"max_ms": 20})
    newest = engine.enqueue(NewJob("debug.sleep", profile=key))
    pinned = engine.enqueue(NewJob("debug.sleep", profile=f"{key}:v1"))
    for job_id in (newest, pinned):
        got, attempt = claim_one(engine)
        assert got == job_id
        out = Output(output_type="verdict", mime_type="application/json", metadata={})
        assert engine.settle(W1, [done(job_id, attempt, outputs=[out])]) == {job_id}
    assert [o["profile_version"] for o in outputs(driver, newest)] == [f"{key}:v2"]
    assert [o["profile_version"] for o in outputs(driver, pinned)] == [f"{key}:v1"]
    assert job_row(driver, pinned)["profile_id"] == profiles.show(f"{key}:v1")["profile_id"]


def test_concurrent_creates_of_one_key_get_distinct_versions(engine, database_url, settings):
    """16 at once: five tries to take the next number refused a third of them
    ("being changed by others") before creators queued on the key's lock."""
    key = _key()
    got = race(
        database_url,
        16,
        lambda drv, i: Profiles(Engine(drv, settings)).create(key, "debug.sleep", {})["ref"],
    )
    assert all(isinstance(ref, str) for ref in got), got
    assert sorted(got, key=lambda ref: int(ref.rsplit(":v", 1)[1])) == [
        f"{key}:v{n}" for n in range(1, 17)
    ], got


def test_a_pipeline_without_schema_checks_settings_with_its_validator(engine: Engine):
    with pytest.raises(InvalidRequest, match=r"debug\.sleep"):
        Profiles(engine).create(_key(), "debug.sleep", {"max_ms": "soon"})
    # Past any timeout (it overflowed the child's clock), unknown keys, NUL:
    # refused, as a schema would (they were stored).
    for bad in ({"max_ms": 10**20}, {"max_ms": -5}, {"x": "\u0000"}):
        with pytest.raises(InvalidRequest, match=r"max_ms must be|unknown settings: x|NUL"):
            Profiles(engine).create(_key(), "debug.sleep", bad)
    with pytest.raises(InvalidRequest, match="takes no settings"):
        Profiles(engine).create(_key(), "debug.noop", {"max_ms": 5})
    assert Profiles(engine).create(_key(), "debug.sleep", {"max_ms": 5})["settings"] == {
        "max_ms": 5
    }


def test_unstorable_text_is_refused_before_anything_is_stored(engine: Engine, resize: str):
    """SQLite kept a lone surrogate (and NUL), which PostgreSQL refuses: every
    answer that carried the row was a 500 from then on."""
    profiles, key = Profiles(engine), _key()
    for bad in ({"format": "we\ud800bp"}, {"format": "a\x00"}, {"\udcff": 1}):
        with pytest.raises(InvalidRequest, match="lone surrogates"):
            profiles.create(key, resize, bad)
    with pytest.raises(NotFound):
        profiles.show(key)  # nothing was stored
    profiles.create(key, resize, {})
    for params in ({"format": "x\udcff"}, {"nested": ["\x00"]}):
        with pytest.raises(InvalidRequest, match="lone surrogates"):
            engine.enqueue(NewJob(resize, params, profile=key))


# PostgreSQL: on MariaDB the jobs' foreign key holds a shared lock on the
# profile row, and the deactivation waits for the request to commit.
@pytest.mark.parametrize("database_url", [b for b in BACKENDS if b == "postgresql"], indirect=True)
def test_one_request_of_many_jobs_reads_its_profile_once(engine: Engine, driver, resize: str):
    """A version deactivated while `--count N` was being written (another
    transaction, committed between two chunks): the later chunks took the
    older version, one request split between two."""
    profiles, key = Profiles(engine), _key()
    profiles.create(key, resize, {"width": 300})
    v2 = profiles.create(key, resize, {"width": 400})
    first_chunk = engine.enqueue_in
    calls = []

    def enqueue_in(tx, jobs, **kw):  # type: ignore[no-untyped-def]
        if calls:  # between two chunks, another transaction deactivates v2
            with driver.tx() as other:
                other.set_profile_active(v2["profile_id"], False)
        calls.append(len(jobs))
        return first_chunk(tx, jobs, **kw)

    engine.enqueue_in = enqueue_in  # type: ignore[method-assign]
    ids = engine.enqueue_many([NewJob(resize, profile=key) for _ in range(6)], chunk=2)
    assert calls == [2, 2, 2]
    assert {engine.get(i)["params"]["width"] for i in ids} == {400}
