"""Job type → pipeline. Workers look pipelines up here inside the child process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypermedia.errors import JobError

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
    ) -> None:
        self.scratch = scratch
        self.input_path = input_path
        self._report = report
        self.outputs: list[dict[str, Any]] = []

    def progress(self, percent: float | None = None, step: str | None = None) -> None:
        self._report({"percent": percent, "step": step})

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


@dataclass(frozen=True)
class Pipeline:
    job_type: str
    queue: str
    validate: Validator  # (params, profile settings) -> params, raising JobError
    run: Runner


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


def known() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


_builtin_loaded = False


def _load_builtin() -> None:
    # A flag, not "registry empty": a module that imported one pipeline
    # early must not keep the other built-ins from registering.
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        from hypermedia.pipelines import debug, image  # noqa: F401  (registers on import)
