"""Settings schemas: profile checks and job overrides, as data."""

from __future__ import annotations

import pytest

from hypermedia.errors import JobError
from hypermedia.pipelines.schema import (
    Field,
    clean_settings,
    describe,
    merge_params,
    public,
    validator,
)

SCHEMA = {
    "width": Field(int, 200, 1, 8192),
    "format": Field(str, "webp", choices=("webp", "jpeg")),
    "quality": Field(int, 85, 1, 100),
    "ratio": Field(float, 1.5, 0.1, 10.0),
    "strip": Field(bool, True),
    "max_pixels": Field(int, 100_000_000, 1, 10**10, overridable=False),
}


def test_clean_settings_fills_defaults_and_checks() -> None:
    assert clean_settings(SCHEMA, {"width": 300}) == {
        "width": 300,
        "format": "webp",
        "quality": 85,
        "ratio": 1.5,
        "strip": True,
        "max_pixels": 100_000_000,
    }
    assert clean_settings(SCHEMA, {"ratio": 2})["ratio"] == 2.0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"width": 100_000}, "width must be from 1 to 8192"),
        ({"quality": 500}, "quality must be from 1 to 100"),
        ({"format": "bmp"}, "format must be one of webp, jpeg"),
        ({"width": "200"}, "width must be an integer"),
        ({"width": True}, "width must be an integer"),
        ({"strip": 1}, "strip must be true or false"),
        ({"colour": "red"}, "unknown settings: colour"),
    ],
)
def test_bad_settings_are_refused(settings: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(JobError) as err:
        clean_settings(SCHEMA, settings)
    assert err.value.code == "INVALID_PARAMS" and message in err.value.reason


def test_params_override_only_what_the_profile_allows() -> None:
    merged = merge_params(SCHEMA, {"width": 300, "quality": 70}, {"quality": 90})
    assert (merged["width"], merged["quality"]) == (300, 90)
    with pytest.raises(JobError, match="set by the profile"):
        merge_params(SCHEMA, {}, {"max_pixels": 10**10})
    with pytest.raises(JobError, match="unknown parameters: nope"):
        merge_params(SCHEMA, {}, {"nope": 1})


def test_validator_adds_cross_field_rules() -> None:
    def check(values: dict) -> None:  # type: ignore[type-arg]
        if values["format"] == "jpeg" and values["quality"] < 10:
            raise JobError("INVALID_PARAMS", "jpeg needs quality >= 10")

    validate = validator(SCHEMA, check)
    assert validate({"format": "jpeg"}, {})["quality"] == 85
    with pytest.raises(JobError, match="quality >= 10"):
        validate({"format": "jpeg", "quality": 5}, {})


def test_describe_is_plain_data() -> None:
    d = describe(SCHEMA)
    assert d["width"] == {
        "type": "an integer",
        "default": 200,
        "min": 1,
        "max": 8192,
        "overridable": True,
    }
    assert d["format"]["choices"] == ["webp", "jpeg"]
    assert d["max_pixels"]["overridable"] is False


def test_private_fields_are_marked_and_left_out_of_public() -> None:
    schema = {
        "socket": Field(str, "unix:///run/d.ctl", overridable=False, private=True),
        "limit": Field(int, 5, 1, 10),
    }
    assert describe(schema)["socket"]["private"] is True
    assert "private" not in describe(schema)["limit"]
    values = clean_settings(schema, {})
    assert public(schema, values) == {"limit": 5}
    assert values["socket"] == "unix:///run/d.ctl"  # kept in what the job runs with
