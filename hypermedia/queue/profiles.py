"""Profiles and credits: versioned settings per job type, and what jobs cost.

A profile version (``image-thumbnail:v3``) names a job type, its settings, its
default queue, limits and prices.  Versions are created, listed and
deactivated, never changed or deleted (seed 000): an output records the
version that made it, so old outputs stay explainable.  ``KEY`` means the
newest active version, ``KEY:vN`` that exact one.

Credits (seed 000): ``estimated_credits`` is set when a job is created from the
profile's prices and what is known of the input; ``actual_credits`` on
completion from what the pipeline reports it processed.  A project may have a
budget; the engine refuses an enqueue that would take the project past it.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from hypermedia.errors import BAD_CURSOR, Conflict, InvalidRequest, JobError, NotFound
from hypermedia.parse import storable
from hypermedia.pipelines import registry
from hypermedia.queue.models import UNSTORABLE, check_project_id, check_queue_name

if TYPE_CHECKING:
    from hypermedia.queue.engine import Engine

Row = dict[str, Any]

KEY = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}\Z")
VERSION = re.compile(r"^v([1-9][0-9]{0,8})\Z")
MAX_PRICE = 1_000_000
MAX_TIMEOUT = 7 * 86_400
DEFAULT_TIMEOUT = 3600
DEFAULT_MAX_INPUT = 5 * 1024**3  # seed 000: 5 GB
MAX_BUDGET = 10**15
MAX_CREDITS = 2**31 - 1  # estimated_credits and actual_credits are INT columns
MB = 1_048_576


@dataclass(frozen=True)
class Prices:
    """A profile version's credit prices (whole credits)."""

    base: int = 0
    per_mb: int = 0
    per_page: int = 0
    per_minute: int = 0

    @classmethod
    def of(cls, profile: Mapping[str, Any]) -> Prices:
        return cls(
            int(profile["credit_cost_base"]),
            int(profile["credit_cost_per_mb"]),
            int(profile["credit_cost_per_page"]),
            int(profile["credit_cost_per_minute"]),
        )

    @property
    def flat(self) -> bool:
        """Whether the price is the base alone, whatever the input."""
        return not (self.per_mb or self.per_page or self.per_minute)


# -- pricing (pure) -------------------------------------------------------------------


def price(prices: Prices, mb: Fraction, pages: Fraction, minutes: Fraction) -> int:
    """base + per_mb·mb + per_page·pages + per_minute·minutes, rounded up.

    Exact arithmetic (fractions): a whole price is never pushed to the next
    credit by a float's last digit (half a MB at 10 credits is 5, not 6).
    Capped at what the credit columns hold.
    """
    total = prices.base + prices.per_mb * mb + prices.per_page * pages
    return min(MAX_CREDITS, max(0, math.ceil(total + prices.per_minute * minutes)))


def estimate(prices: Prices, size_bytes: int, pages: int | None, duration_ms: int | None) -> int:
    """At creation: the input's size, and its pages and duration when known
    (1 page and 0 minutes otherwise)."""
    if prices.flat:  # the common case, and enqueue is hot: no fractions
        return min(MAX_CREDITS, max(0, prices.base))
    mb, pages_, minutes = _probe(size_bytes, pages, duration_ms)
    exact = prices.base + prices.per_mb * mb + prices.per_page * pages_
    total = math.ceil(exact + prices.per_minute * minutes)
    if total > MAX_CREDITS:
        # Capped, it would fit budgets it does not (a 3,000-page range at a
        # million credits a page, stored as 2,147,483,647).
        raise InvalidRequest(
            f"this job is priced at {total} credits, over the {MAX_CREDITS} one job may cost"
        )
    return max(0, total)


def actual(
    prices: Prices,
    size_bytes: int,
    pages: int | None,
    duration_ms: int | None,
    result: Any,
) -> int:
    """On completion: what the pipeline says it processed (``result["usage"]``:
    ``pages``, ``minutes``, ``mb``), falling back on what it found out about
    its input (``result["input_facts"]``), then on what the estimate used."""
    facts = input_facts(result)
    pages = facts.get("pages", pages)
    duration_ms = facts.get("duration_ms", duration_ms)
    mb, n_pages, minutes = _probe(size_bytes, pages, duration_ms)
    usage = result.get("usage") if isinstance(result, dict) else None
    if isinstance(usage, dict):
        mb = _amount(usage.get("mb"), mb)
        n_pages = _amount(usage.get("pages"), n_pages)
        minutes = _amount(usage.get("minutes"), minutes)
    return price(prices, mb, n_pages, minutes)


FACT_LIMITS = {"pages": 10**7, "duration_ms": 10**12, "width": 2**31 - 1, "height": 2**31 - 1}


def input_facts(result: Any) -> Row:
    """The checked ``input_facts`` of a pipeline's result: what it learnt about
    its input (pages, duration_ms, width, height).  Anything else is dropped:
    the child process handled hostile bytes, its word is checked, not trusted."""
    facts = result.get("input_facts") if isinstance(result, dict) else None
    if not isinstance(facts, dict):
        return {}
    return {
        k: v
        for k, v in facts.items()
        if k in FACT_LIMITS
        and isinstance(v, int)
        and not isinstance(v, bool)
        and 0 <= v <= FACT_LIMITS[k]
    }


def _probe(
    size_bytes: int, pages: int | None, duration_ms: int | None
) -> tuple[Fraction, Fraction, Fraction]:
    return (
        Fraction(max(0, int(size_bytes)), MB),
        Fraction(1 if pages is None else max(0, int(pages))),
        Fraction(max(0, int(duration_ms or 0)), 60_000),
    )


def _amount(value: Any, default: Fraction) -> Fraction:
    """A usage amount: a finite number from 0 to 10¹²; anything else keeps ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if not math.isfinite(value) or not 0 <= value <= 1e12:
        return default
    # str() first: 0.3 is 3/10, not the binary fraction a bit above it.
    return Fraction(str(value)) if isinstance(value, float) else Fraction(value)


# -- references --------------------------------------------------------------------------


def price_text(profile: Mapping[str, Any]) -> str:
    """A profile's prices as one short cell: base + per MB / page / minute
    (the CLI's listing and the dashboard's say it alike)."""
    parts = [str(profile["credit_cost_base"])]
    for col, unit in (
        ("credit_cost_per_mb", "MB"),
        ("credit_cost_per_page", "page"),
        ("credit_cost_per_minute", "min"),
    ):
        if profile[col]:
            parts.append(f"{profile[col]}/{unit}")
    return " + ".join(parts)


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``"key"`` → (key, None); ``"key:vN"`` → (key, "vN")."""
    key, sep, version = ref.partition(":")
    if not KEY.match(key) or (sep and not VERSION.match(version)):
        raise InvalidRequest(f"{ref!r} is not a profile reference (KEY or KEY:vN)")
    return key, (version if sep else None)


def ref_of(profile: Mapping[str, Any]) -> str:
    return f"{profile['profile_key']}:{profile['profile_version']}"


def _number(version: str) -> int:
    m = VERSION.match(version)
    return int(m.group(1)) if m else 0


# -- use cases ------------------------------------------------------------------------


class Profiles:
    """Create, list, show and deactivate profile versions."""

    def __init__(self, engine: Engine) -> None:
        self.db = engine.db
        self.clock = engine.clock

    def create(
        self,
        key: str,
        job_type: str,
        settings: Mapping[str, Any] | None,
        *,
        queue: str | None = None,
        credits: Prices | Mapping[str, int | None] | None = None,
        timeout_seconds: int | None = None,
        max_input_bytes: int | None = None,
    ) -> Row:
        """A new version ``vN`` of ``key`` (N = highest existing + 1; the first is v1).

        The settings are checked against the job type's schema (unknown keys,
        types, ranges, choices) and stored completed with its defaults: a
        version's settings are always the whole of them.  What is not given
        (None: the settings, queue, prices, timeout, input limit) carries over
        from the key's newest version, so a new version never resets settings
        or prices by omission; a new key takes the schema's defaults, the
        pipeline's queue, one hour, 5 GB and no charge.  ``credits`` is a
        ``Prices`` (all four) or a mapping of some of ``base``, ``per_mb``,
        ``per_page``, ``per_minute``.
        """
        if not KEY.match(key):
            raise InvalidRequest(
                "a profile key has 1 to 100 characters: lower-case letters, digits, '.', '_', '-'"
            )
        try:
            pipeline = registry.get(job_type)
        except JobError as exc:
            raise InvalidRequest(exc.reason) from None
        given: Row = {
            "queue_name": None if queue is None else check_queue_name(queue),
            "settings": None if settings is None else _settings(pipeline, settings),
            "timeout_seconds": timeout_seconds,
            "max_input_bytes": max_input_bytes,
            **_price_columns(credits),
        }
        for attempt in range(5):
            try:
                with self.db.tx() as tx:
                    tx.lock_profile_key(key)
                    # The newest alone: each version is made after the one
                    # before, under this lock (every version read, 10,000 of
                    # them made the next take 0.15 s, all creates waiting).
                    newest = tx.profile(key, None, active_only=False)
                    last = newest or _defaults(pipeline)
                    if last["job_type"] != job_type:
                        raise InvalidRequest(
                            f"profile {key} is for {last['job_type']}, not {job_type}"
                        )
                    n = (_number(newest["profile_version"]) if newest else 0) + 1
                    row = {c: last[c] if v is None else v for c, v in given.items()}
                    _bounded("timeout", row["timeout_seconds"], 1, MAX_TIMEOUT)
                    _bounded("max input bytes", row["max_input_bytes"], 1, 2**62)
                    row.update(
                        profile_key=key,
                        profile_version=f"v{n}",
                        job_type=job_type,
                        is_active=True,
                        created_at=self.clock(),
                    )
                    profile_id = tx.insert_profile(row)
                    return _public(tx.profile_by_id(profile_id) or {})
            except Conflict:
                # A concurrent create took this number (only first versions race:
                # later ones queue on the lock): take the next.
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise Conflict(f"profile {key} is being changed by others; try again")

    def list(
        self,
        job_type: str | None = None,
        include_inactive: bool = False,
        *,
        key: str | None = None,
        after_id: int | None = None,
        limit: int | None = None,
    ) -> list[Row]:
        """Versions by key, oldest first; a page of ``limit`` from just past
        version ``after_id`` (the previous page's last) when given."""
        with self.db.read() as tx:
            after = None
            if after_id is not None:
                after = tx.profile_by_id(after_id)
                if after is None:
                    raise InvalidRequest(BAD_CURSOR)
            rows = tx.profiles(
                job_type, include_inactive=include_inactive, key=key, after=after, limit=limit
            )
        return [_public(r) for r in rows]

    def job_type_of(self, key: str) -> str | None:
        """The job type of ``key``'s versions, active or not (None: a new key)."""
        with self.db.read() as tx:
            newest = tx.profile(key, None, active_only=False) if KEY.match(key) else None
        return None if newest is None else str(newest["job_type"])

    def show(self, ref: str) -> Row:
        """``key``: the newest active version; ``key:vN``: that version, active or not."""
        with self.db.read() as tx:
            return _public(self._find(tx, ref))

    def deactivate(self, ref: str) -> Row:
        """Stop new jobs from using a version, named ``key:vN``.

        Jobs already created keep it, and it is never deleted.  Deactivating
        the last active version is allowed: new jobs naming the key are then
        refused until a new version is created.  Again, it changes nothing.
        A bare key is refused: it meant the newest active version, so each
        repeat (a retried request) retired one more.
        """
        with self.db.tx() as tx:
            row = self._find(tx, ref)
            if parse_ref(ref)[1] is None:
                raise InvalidRequest(
                    f"name the version to deactivate: {ref_of(row)} is the newest active one "
                    "(a bare key would retire one more each time)"
                )
            tx.set_profile_active(row["profile_id"], False)
            return _public({**row, "is_active": False})

    @staticmethod
    def _find(tx: Any, ref: str) -> Row:
        key, version = parse_ref(ref)
        row = tx.profile(key, version)
        if row is None:
            if version is None and tx.has_profile_key(key):
                raise NotFound(f"profile {key} has no active version")
            raise NotFound(f"no profile {ref}")
        return dict(row)


class Credits:
    """Project budgets and what projects have used."""

    def __init__(self, engine: Engine) -> None:
        self.db = engine.db
        self.clock = engine.clock

    def show(self, project_id: str | None = None) -> list[Row]:
        """Budget, used and remaining per project (one project, or every known one).

        Used = actual credits of completed jobs + estimates of jobs not yet
        finished; failed and cancelled jobs cost nothing.  Read in one
        snapshot: the credit fold and job retention move credits from job
        rows to ``settled_credits`` in one commit (db/credit_queries.py).
        """
        if project_id is not None:
            check_project_id(project_id)  # "" or 300 characters: no project's
        with self.db.snapshot() as tx:
            if project_id is not None:
                budget = tx.budget(project_id)
                return [_usage(project_id, budget, tx.credit_use(project_id))]
            budgets = {b["project_id"]: b for b in tx.budgets()}
            used = tx.credit_use_by_project()
            # One with tokens only (none of its work started yet) is listed too.
            named = {r["project_id"] for r in tx.projects()}
        every = sorted({*budgets, *used, *named})
        return [_usage(p, budgets.get(p), used.get(p, 0)) for p in every]

    def is_known(self, project_id: str) -> bool:
        """Whether a token, a budget, a job or a stored object names the
        project already: a budget set for none of these is most likely a
        typo of one that is."""
        check_project_id(project_id)
        with self.db.read() as tx:
            return (
                tx.project(project_id) is not None
                or tx.budget(project_id) is not None
                # Any job, a free or failed one too: credit use said "unknown".
                or tx.project_has_jobs(project_id)
                or tx.credit_use(project_id) > 0  # jobs folded and deleted
                # Uploaded first, budgeted next, submitted last: no typo.
                or tx.project_has_objects(project_id)
            )

    def set_budget(self, project_id: str, credits: int | None) -> Row:
        """Set a project's budget; None: no limit.  A budget below what is
        already used is allowed: it refuses new work, it cancels nothing."""
        check_project_id(project_id)
        if credits is not None:
            _bounded("budget", credits, 0, MAX_BUDGET)
        # Concurrent first budgets of a project race on one new row.
        self.db.tx_retrying(lambda tx: tx.set_budget(project_id, credits, self.clock()))
        return self.show(project_id)[0]


def _usage(project_id: str, budget: Row | None, used: int) -> Row:
    limit = None if budget is None else budget["budget_credits"]
    limit = None if limit is None else int(limit)
    return {
        "project_id": project_id,
        "budget": limit,
        "used": used,
        "remaining": None if limit is None else limit - used,
    }


def _public(row: Mapping[str, Any]) -> Row:
    out = dict(row)
    out["ref"] = ref_of(row)
    out["is_active"] = bool(row["is_active"])
    return out


def _settings(pipeline: registry.Pipeline, settings: Mapping[str, Any]) -> Row:
    from hypermedia.pipelines import schema

    if not isinstance(settings, Mapping) or not all(isinstance(k, str) for k in settings):
        raise InvalidRequest("settings must be a JSON object")
    if not storable(dict(settings)):
        raise InvalidRequest(UNSTORABLE.format(what="settings"))
    try:
        if pipeline.schema is not None:
            settings = schema.clean_settings(pipeline.schema, settings)
        # Then the pipeline's own checks across fields (first_page after
        # last_page, a clamd URL of no known scheme): a version that passed the
        # schema alone became the newest active one and refused every job.
        pipeline.validate({}, dict(settings))
    except JobError as exc:
        raise InvalidRequest(f"settings refused for {pipeline.job_type}: {exc.reason}") from None
    except (TypeError, ValueError):
        raise InvalidRequest(f"settings refused for {pipeline.job_type}") from None
    return dict(settings)


PRICE_COLUMNS = {
    "base": "credit_cost_base",
    "per_mb": "credit_cost_per_mb",
    "per_page": "credit_cost_per_page",
    "per_minute": "credit_cost_per_minute",
}


def _price_columns(credits: Prices | Mapping[str, int | None] | None) -> Row:
    """Price columns given (None: carried over from the previous version)."""
    if isinstance(credits, Prices):
        credits = {name: getattr(credits, name) for name in PRICE_COLUMNS}
    credits = dict(credits or {})
    unknown = set(credits) - set(PRICE_COLUMNS)
    if unknown:
        raise InvalidRequest(f"unknown prices: {', '.join(sorted(unknown))}")
    return {
        col: None
        if credits.get(name) is None
        else _bounded(f"credits {name.replace('_', ' ')}", credits[name], 0, MAX_PRICE)
        for name, col in PRICE_COLUMNS.items()
    }


def _defaults(pipeline: registry.Pipeline) -> Row:
    """What a new key's first version takes when not told otherwise."""
    return {
        "job_type": pipeline.job_type,
        "settings": _settings(pipeline, {}),
        "queue_name": pipeline.queue,
        "timeout_seconds": DEFAULT_TIMEOUT,
        "max_input_bytes": DEFAULT_MAX_INPUT,
        **dict.fromkeys(PRICE_COLUMNS.values(), 0),
    }


def _bounded(what: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{what} must be an integer from {low} to {high}")
    return value
