"""Job type → pipeline. Workers look pipelines up here inside the child process."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from hypermedia.errors import JobError
from hypermedia.pipelines.schema import Schema, public

if TYPE_CHECKING:  # the child imports this module and must never load the database
    from hypermedia.queue.models import Claimed
    from hypermedia.storage.ledger import Storage

Runner = Callable[[dict[str, Any], "Context"], dict[str, Any] | None]
Validator = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


class Context:
    """What a running pipeline may use: its scratch directory, its input file
    (already downloaded there, or None), a progress callback, and outputs."""

    def __init__(
        self,
        scratch: str,
        report: Callable[[dict[str, Any]], None],
        input_path: str | None = None,
        budget: Callable[[float | None, str], None] | None = None,
    ) -> None:
        self.scratch = scratch
        self.input_path = input_path
        self._report = report
        self._budget = budget
        self.outputs: list[dict[str, Any]] = []

    def progress(self, percent: float | None = None, step: str | None = None) -> None:
        self._report({"percent": percent, "step": step})

    def budget(self, seconds: float | None, reason: str = "") -> None:
        """The worker fails the attempt for good (LIMIT_EXCEEDED, ``reason``)
        unless the step begun now ends within ``seconds`` (None: it has ended).
        For work a native library does in one call that a pipeline's own
        clock cannot interrupt; the attempt's timeout still bounds the rest."""
        if self._budget is not None:
            self._budget(seconds, reason)

    def output(
        self,
        output_type: str,
        mime_type: str,
        metadata: dict[str, Any],
        path: str | None = None,
    ) -> None:
        """Declare a derived result; the worker records it when the attempt completes.

        ``path`` names a file the pipeline wrote in its scratch directory: the
        worker stores it as a new object once the attempt ends.
        """
        self.outputs.append(
            {"output_type": output_type, "mime_type": mime_type, "metadata": metadata, "path": path}
        )


@dataclass
class FinishContext:
    """What a pipeline's ``finish`` may use: it runs in the worker, not the child.

    ``storage`` is the worker's objects ledger (and, through ``storage.db``,
    the database); ``job`` the claimed job (project_id, object_id...);
    ``result`` what the child's ``run`` returned.  ``output`` declares a
    data-only output, recorded with the child's own when the attempt completes.
    """

    storage: Storage
    job: Claimed
    result: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)

    def output(self, output_type: str, mime_type: str, metadata: dict[str, Any]) -> None:
        self.outputs.append(
            {"output_type": output_type, "mime_type": mime_type, "metadata": metadata, "path": None}
        )


Finisher = Callable[[FinishContext], dict[str, Any]]


def _always_available() -> str | None:
    return None


@dataclass(frozen=True)
class Pipeline:
    """A job type: how its params are checked, how it runs in the child, what it needs.

    ``schema`` declares the settings a profile may set and a job may override
    (see ``schema.py``); with a schema, ``validate`` is usually
    ``schema.validator(SCHEMA)``.  ``available`` says, cheaply and in the
    worker, whether the tools the pipeline needs are installed: None when they
    are, else a short reason safe to show.  ``run`` raises JobError with the
    engine's codes, never bare exceptions (a bare one becomes INTERNAL), and
    may return ``{"usage": {"pages": n, "minutes": m, "mb": x}}`` among its
    result so credits are charged for what was processed.

    ``finish``, when set, completes a successful attempt in the worker, which
    (unlike the child) has the database: it gets the child's result and
    returns the job's final result (see ``FinishContext``).  It runs before
    the attempt's outputs are stored; a JobError it raises fails the attempt
    with that code, and so must anything else that goes wrong in it.
    """

    job_type: str
    queue: str
    validate: Validator  # (params, profile settings) -> params, raising JobError
    run: Runner
    schema: Schema | None = None
    available: Callable[[], str | None] = _always_available
    # ``available`` for one profile's settings, where they name what is probed
    # (the virus scan's clamd socket); unset: ``available`` for every profile.
    available_with: Callable[[Mapping[str, Any]], str | None] | None = None
    doc: str = ""
    finish: Finisher | None = None
    # The profile a job uses when it names none; "" means the job type with
    # dashes (image.thumbnail → image-thumbnail).
    default_profile: str = ""
    # Loads the pipeline's libraries (pyvips, pdfium): a worker's fresh child
    # calls it before its first attempt arrives, so no attempt pays for them.
    warm: Callable[[], object] | None = None
    # Whether its attempts talk to another process over a socket (clamd):
    # every other attempt runs in a child that cannot open one (seccomp.py).
    # A function of the job's params where that depends on them.
    network: bool | Callable[[dict[str, Any]], bool] = False
    # Whether a job of this type reads an input object: one without is refused
    # when it is enqueued (a 422), not failed later by its first attempt.
    needs_input: bool = False
    # The pages a job will process of an input of ``pages`` pages (None:
    # not known yet), as its validated params pick them: what its estimate
    # prices.  Unset: the whole input (a page range of one page of a
    # 5,000-page PDF was held as 5,000 pages against the budget).
    pages: Callable[[dict[str, Any], int | None], int | None] | None = None

    @property
    def profile_key(self) -> str:
        return self.default_profile or self.job_type.replace(".", "-")


_REGISTRY: dict[str, Pipeline] = {}


def register(p: Pipeline) -> Pipeline:
    _REGISTRY[p.job_type] = p
    return p


def get(job_type: str) -> Pipeline:
    _load_builtin()
    try:
        return _REGISTRY[job_type]
    except KeyError:
        raise JobError("UNSUPPORTED_FORMAT", f"unknown job type {job_type!r}") from None


def needs_network(job_type: str, params: dict[str, Any]) -> bool:
    """Whether this job's attempt must run in a child that may open sockets."""
    _load_builtin()
    p = _REGISTRY.get(job_type)
    if p is None:
        return False
    return bool(p.network(params) if callable(p.network) else p.network)


def public_settings(job_type: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """A profile's settings or a job's params as a non-admin token sees them:
    without the fields its pipeline marks private (where clamd listens)."""
    _load_builtin()
    p = _REGISTRY.get(job_type)
    if not values or p is None or p.schema is None:
        return dict(values or {})
    return public(p.schema, values)


def known() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def availability(job_types: Iterable[str] | None = None) -> dict[str, str | None]:
    """Each job type's missing-tool reason (None: ready to run here)."""
    _load_builtin()
    wanted = sorted(_REGISTRY) if job_types is None else sorted(set(job_types) & set(_REGISTRY))
    return {t: _probe(_REGISTRY[t].available) for t in wanted}


def readiness(profiles: Iterable[Mapping[str, Any]]) -> dict[str, str | None]:
    """Each profile version's missing-tool reason by ``ref``: its job type's,
    or the one its settings name (a virus scan's own clamd socket)."""
    _load_builtin()
    keys: dict[str, tuple[str, str]] = {}
    checks: dict[tuple[str, str], Callable[[], str | None]] = {}
    out: dict[str, str | None] = {}
    for p in profiles:
        pipeline = _REGISTRY.get(p["job_type"])
        if pipeline is None:
            out[p["ref"]] = "unknown job type"
            continue
        with_settings = pipeline.available_with
        settings = dict(p.get("settings") or {})
        key = (p["job_type"], repr(sorted(settings.items())) if with_settings else "")
        keys[p["ref"]] = key
        checks[key] = (
            pipeline.available if with_settings is None else partial(with_settings, settings)
        )
    found = _probed(checks)
    return {**out, **{ref: found[key] for ref, key in keys.items()}}


# The dashboard's Upload and Profiles pages ask on every load: a clamd that
# takes connections and never answers cost each load its 2 s per profile, one
# after another (8 s with a few).  Now at once, and remembered a little while.
READY_SECONDS = 10.0
_ready: dict[tuple[str, str], tuple[float, str | None]] = {}
_ready_lock = threading.Lock()


def _probed(
    checks: Mapping[tuple[str, str], Callable[[], str | None]],
) -> dict[tuple[str, str], str | None]:
    now = time.monotonic()
    with _ready_lock:
        found = {
            k: _ready[k][1] for k in checks if k in _ready and now - _ready[k][0] < READY_SECONDS
        }
    todo = [k for k in checks if k not in found]
    if len(todo) == 1:
        found[todo[0]] = _probe(checks[todo[0]])
    elif todo:
        from concurrent.futures import ThreadPoolExecutor  # not for the child to load

        with ThreadPoolExecutor(min(8, len(todo)), thread_name_prefix="probe") as pool:
            found.update(zip(todo, pool.map(lambda k: _probe(checks[k]), todo), strict=True))
    with _ready_lock:
        if len(_ready) > 1000:  # profiles come and go: forget the old
            _ready.clear()
        _ready.update({k: (time.monotonic(), found[k]) for k in todo})
    return found


def _probe(available: Callable[[], str | None]) -> str | None:
    try:
        return available()
    except Exception:  # a probe that breaks means "not available", never a crash
        return "its tools could not be checked"


def queues() -> set[str]:
    """The queues the built-in pipelines use by default."""
    _load_builtin()
    return {p.queue for p in _REGISTRY.values()}


def job_types_for(queues: Iterable[str]) -> list[str]:
    """The job types whose pipelines run on ``queues`` by default."""
    _load_builtin()
    wanted = set(queues)
    return sorted(t for t, p in _REGISTRY.items() if p.queue in wanted)


def warm(job_types: Iterable[str]) -> None:
    """Load what these job types' pipelines need (in a child, ahead of work)."""
    _load_builtin()
    for job_type in job_types:
        p = _REGISTRY.get(job_type)
        if p is None or p.warm is None:
            continue
        # A missing tool is not an error here: the attempt reports it itself.
        with contextlib.suppress(Exception):
            p.warm()


_builtin_loaded = False
_builtin_lock = threading.RLock()  # re-entrant: a pipeline module may look one up


def _load_builtin() -> None:
    # A flag, not "registry empty": a module that imported one pipeline
    # early must not keep the other built-ins from registering.  Fix: under a
    # lock, and set only once the imports are done: a second thread (another
    # slot, an API request) used to see the flag up and an empty registry,
    # and refused a known job type as unknown.
    global _builtin_loaded
    if _builtin_loaded:
        return
    with _builtin_lock:
        if not _builtin_loaded:
            from hypermedia.pipelines import debug, dedup, image, pdf, virus  # noqa: F401

            _builtin_loaded = True
