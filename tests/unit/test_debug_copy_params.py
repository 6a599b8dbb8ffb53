"""debug.copy's ``name`` is a file name: one with a '/' failed in the child
as an INTERNAL error, retried three times, instead of at enqueue."""

from __future__ import annotations

import pytest

from hypermedia.errors import JobError
from hypermedia.pipelines import debug, registry  # noqa: F401  (registers debug.*)


@pytest.mark.parametrize("name", ["a/b", "/etc/x", ".", "..", "../up"])
def test_a_name_that_is_no_file_name_is_refused(name: str) -> None:
    with pytest.raises(JobError) as info:
        registry.get("debug.copy").validate({"name": name}, {})
    assert info.value.code == "INVALID_PARAMS" and "file name" in info.value.reason


def test_a_plain_name_and_any_symlink_target_pass() -> None:
    params = {"name": "copy.txt", "symlink": "/etc/passwd"}  # the target: a hostile output
    assert registry.get("debug.copy").validate(params, {}) == params
