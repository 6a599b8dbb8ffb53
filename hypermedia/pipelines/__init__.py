"""Pipelines: what each job type does. A pipeline never touches the database."""

from hypermedia.pipelines.registry import Pipeline, get, known, register

__all__ = ["Pipeline", "get", "known", "register"]
