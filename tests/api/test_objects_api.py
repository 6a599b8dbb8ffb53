"""/v1/objects on every database: uploads (raw, multipart, capped), list, show,
signed URLs and the signed download."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.api.routes.objects import PUBLIC_FIELDS
from hypermedia.queue.engine import Engine
from hypermedia.services import Services
from hypermedia.storage import local
from tests.api.conftest import Project, bearer
from tests.harness import checksum_of
from tests.media import png

LIMIT = 1000
BOUNDARY = "hm-test-boundary"


@pytest.fixture
def small(svc: Services) -> Iterator[TestClient]:
    """An app over the same database whose uploads are capped at LIMIT bytes."""
    capped = Services.from_engine(Engine(svc.engine.db, svc.settings.with_(max_upload_bytes=LIMIT)))
    with TestClient(create_app(capped), raise_server_exceptions=False) as c:
        yield c


def upload(client: TestClient, token: str, data: bytes, **params: str) -> dict[str, object]:
    r = client.post("/v1/objects", content=data, params=params, headers=bearer(token))
    assert r.status_code == 201, r.text
    return dict(r.json())


def download(client: TestClient, token: str, object_id: object) -> bytes:
    r = client.get(f"/v1/objects/{object_id}/url", headers=bearer(token))
    assert r.status_code == 200, r.text
    got = client.get(r.json()["url"])  # no token: the signature is enough
    assert got.status_code == 200, got.text
    return got.content


def _link(body: dict[str, Any]) -> tuple[SplitResult, float]:
    """A /url answer's link, split, and its expires_at as a timestamp."""
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00")).timestamp()
    return urlsplit(body["url"]), expires


def test_links_take_the_public_url_not_the_request_host(
    svc: Services, client: TestClient, a: Project
) -> None:
    """A link built from the request's Host is the client's word: behind a
    proxy that passes any Host on, a forged one made links to another site."""
    obj = upload(client, a.admin, b"linked bytes")
    forged = {**bearer(a.admin), "host": "evil.example"}
    r = client.get(f"/v1/objects/{obj['object_id']}/url", headers=forged)
    assert urlsplit(r.json()["url"]).netloc == "evil.example"  # unset: the request's Host
    public = svc.settings.with_(public_url="https://media.example.com/hm")
    with TestClient(create_app(Services.from_engine(Engine(svc.engine.db, public)))) as c:
        body = c.get(f"/v1/objects/{obj['object_id']}/url", headers=forged).json()
        photo = c.post("/v1/photos", content=png(3, 2), headers=forged).json()
    url, expires = _link(body)
    assert (url.scheme, url.netloc, url.path) == (
        "https",
        "media.example.com",
        f"/hm/v1/objects/{obj['object_id']}/content",
    )
    assert f"expires={int(expires)}" in url.query  # read back from the link, as without it
    assert photo["url"].startswith("https://media.example.com/hm/v1/objects/"), photo
    got = client.get(f"{url.path.removeprefix('/hm')}?{url.query}")  # as the proxy passes it
    assert got.content == b"linked bytes"


def form(parts: list[tuple[str, str | None, bytes]]) -> bytes:
    """A multipart body by hand: (name, filename or None, value)."""
    out = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += value + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


FORM = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def leftovers(svc: Services) -> list[str]:
    tmp = svc.settings.home / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


def test_raw_upload_round_trips_through_the_signed_url(
    client: TestClient, a: Project, svc: Services
) -> None:
    data = png(5, 4)
    obj = upload(client, a.scoped["objects:write"], data, filename="red.png")
    assert set(obj) == set(PUBLIC_FIELDS)
    assert obj["checksum"] == checksum_of(data)
    assert (obj["size"], obj["width"], obj["height"]) == (len(data), 5, 4)
    assert (obj["mime_type"], obj["filename"], obj["state"]) == ("image/png", "red.png", "ready")
    assert obj["project_id"] == "proj-a"
    assert download(client, a.scoped["objects:read"], obj["object_id"]) == data
    shown = client.get(f"/v1/objects/{obj['object_id']}", headers=bearer(a.admin)).json()
    assert shown == obj
    assert leftovers(svc) == []


def test_the_signed_url_and_its_download_headers(client: TestClient, a: Project) -> None:
    obj = upload(client, a.admin, b"some bytes", filename="n\u00f8tes v1.txt")
    before = time.time()
    r = client.get(f"/v1/objects/{obj['object_id']}/url", headers=bearer(a.admin))
    body = r.json()
    assert set(body) == {"url", "expires_at"}
    url, expires = _link(body)
    assert (url.scheme, url.netloc, url.path) == (
        "http",
        "testserver",
        f"/v1/objects/{obj['object_id']}/content",
    )
    assert before + 890 <= expires <= time.time() + 900
    assert f"expires={int(expires)}" in url.query
    got = client.get(body["url"])
    assert got.content == b"some bytes"
    assert got.headers["content-length"] == "10"
    assert got.headers["content-disposition"] == (
        "attachment; filename=\"n_tes v1.txt\"; filename*=UTF-8''n%C3%B8tes%20v1.txt"
    )
    assert got.headers["x-content-type-options"] == "nosniff"


def test_multipart_upload_round_trips(client: TestClient, a: Project, svc: Services) -> None:
    data = bytes(range(256)) * 50
    r = client.post(
        "/v1/objects",
        files={"file": ("blob.bin", data, "application/octet-stream")},
        headers=bearer(a.admin),
    )
    assert r.status_code == 201, r.text
    obj = r.json()
    assert (obj["filename"], obj["size"]) == ("blob.bin", len(data))
    assert obj["checksum"] == checksum_of(data)
    assert download(client, a.admin, obj["object_id"]) == data
    assert leftovers(svc) == []
    # A name past 255 characters is cut from its stem: the extension stays.
    long = "y" * 1000 + ".png"
    r = client.post("/v1/objects", files={"file": (long, data)}, headers=bearer(a.admin))
    assert r.status_code == 201 and r.json()["filename"] == "y" * 251 + ".png"


def test_malformed_forms_are_422(client: TestClient, a: Project, svc: Services) -> None:
    h = {**bearer(a.admin), **FORM}
    bad = {
        "no file part": form([("note", None, b"hi")]),
        "two file parts": form([("file", "a", b"1"), ("file", "b", b"2")]),
        "truncated": form([("file", "a", b"1")])[:-20],
    }
    for what, body in bad.items():
        r = client.post("/v1/objects", content=body, headers=h)
        assert r.status_code == 422, what
        assert set(r.json()) == {"code", "message", "request_id"}
    no_boundary = {**bearer(a.admin), "Content-Type": "multipart/form-data"}
    assert client.post("/v1/objects", content=b"x", headers=no_boundary).status_code == 422
    # A file name of 4,200 characters: past the parser's cap on a part's
    # headers, it was "the multipart body is malformed".
    r = client.post("/v1/objects", content=form([("file", "a" * 4200 + ".png", b"1")]), headers=h)
    assert r.status_code == 422 and "headers are too long" in r.json()["message"], r.text
    assert svc.storage.list(state="ready") == []
    assert leftovers(svc) == []


def test_a_form_framed_two_ways_is_422(client: TestClient, a: Project, svc: Services) -> None:
    """A parameter or a part's header given twice was read "last wins": a
    proxy in front reading the first checked one field and the server stored
    another (``name="evil"; name="file"``)."""
    h = bearer(a.admin)

    def part(headers: bytes) -> bytes:
        """A form of one part with these header lines, holding DATA."""
        b = BOUNDARY.encode()
        return b"--%s\r\n%s\r\n\r\nDATA\r\n--%s--\r\n" % (b, headers, b)

    for headers, body in (
        (
            {"Content-Type": f"multipart/form-data; boundary=xx; boundary={BOUNDARY}"},
            form([("file", "q.txt", b"DATA")]),
        ),
        (
            FORM,
            part(b'Content-Disposition: form-data; name="evil"; name="file"; filename="q.txt"'),
        ),
        (
            FORM,
            part(
                b'Content-Disposition: form-data; name="file"; filename="a.txt"; FILENAME="b.txt"'
            ),
        ),
        (
            FORM,
            part(
                b'Content-Disposition: form-data; name="evil"\r\n'
                b'Content-Disposition: form-data; name="file"; filename="q.txt"'
            ),
        ),
    ):
        r = client.post("/v1/objects", content=body, headers={**h, **headers})
        assert r.status_code == 422, (headers, body)
        assert "twice" in r.json()["message"] or "repeats" in r.json()["message"]
    for headers, body in (
        (
            FORM,
            part(
                b'Content-Disposition: form-data; name="file"; '
                b"filename=\"a.txt\"; filename*=UTF-8''b.txt"
            ),
        ),
        (
            FORM,
            part(b'Content-Disposition: form-data; name="file"; filename*0="b"; filename*1=".txt"'),
        ),
        (
            {"Content-Type": f"multipart/form-data; boundary=xx; boundary*=''{BOUNDARY}"},
            form([("file", "q.txt", b"DATA")]),
        ),
    ):
        r = client.post("/v1/objects", content=body, headers={**h, **headers})
        assert r.status_code == 422 and "twice" in r.json()["message"], (headers, body)
    # Two Content-Type lines: which one a reader keeps is its guess (the test
    # client joins them into one; a server hands both on).
    raw = [(b"authorization", f"Bearer {a.admin}".encode())]
    raw += [
        (b"content-type", f"multipart/form-data; boundary={b}".encode()) for b in (BOUNDARY, "o")
    ]
    body = form([("file", "q.txt", b"DATA")])
    r = client.post("/v1/objects", content=body, headers=httpx.Headers(raw))
    assert r.status_code == 422 and "twice" in r.json()["message"], r.text
    assert svc.storage.list() == []
    # RFC 5987's filename* alone is read (the name was empty).
    alone = part(
        b"Content-Disposition: form-data; name=\"file\"; filename*=UTF-8''%E2%82%AC%20rate.txt"
    )
    r = client.post("/v1/objects", content=alone, headers={**h, **FORM})
    assert r.status_code == 201 and r.json()["filename"] == "\u20ac rate.txt", r.text
    # A name that does not decode is refused, as ?filename=%FF is (QA: it was
    # stored with U+FFFD in place of each bad byte); so is an unknown charset.
    for disposition, said in (
        (b'filename="\xff\xfe.png"', "the file part's filename is not UTF-8"),
        (b"filename*=UTF-8''%FF%FE.png", "is not in the charset its filename* names"),
        (b"filename*=x-no-such''a.png", "names a charset other than UTF-8 or ISO-8859-1"),
        # QA: punycode's bare UnicodeError was a 500; utf-7 made a name of its own.
        (b"filename*=punycode''caf-dma.png", "names a charset other than UTF-8 or ISO-8859-1"),
        (b"filename*=utf-7''a+AOk-.png", "names a charset other than UTF-8 or ISO-8859-1"),
    ):
        bad = part(b'Content-Disposition: form-data; name="file"; ' + disposition)
        r = client.post("/v1/objects", content=bad, headers={**h, **FORM})
        assert r.status_code == 422 and said in r.json()["message"], (disposition, r.text)
    latin = part(b"Content-Disposition: form-data; name=file; filename*=ISO-8859-1''%E9t%E9.txt")
    r = client.post("/v1/objects", content=latin, headers={**h, **FORM})
    assert r.status_code == 201 and r.json()["filename"] == "\u00e9t\u00e9.txt", r.text
    # A "; name=" inside a quoted file name is no parameter.
    odd = part(b'Content-Disposition: form-data; name="file"; filename="a; name=b.txt"')
    r = client.post("/v1/objects", content=odd, headers={**h, **FORM})
    assert r.status_code == 201 and r.json()["filename"] == "a; name=b.txt", r.text


def test_a_forms_preamble_is_ignored(client: TestClient, a: Project) -> None:
    """Text before the first boundary (RFC 2046 §5.1.1) was "the multipart
    body is malformed"; a chunk boundary anywhere in it changes nothing."""
    h = {**bearer(a.admin), **FORM}
    body = form([("file", "q.txt", b"DATA")])
    for preamble in (b"", b"\r\n", b"This is a multi-part message.\r\n", b"x" * 70_000 + b"\r\n"):
        whole = preamble + body
        for cut in (1, 7, len(preamble) + 3, len(whole) // 2):
            r = client.post(
                "/v1/objects",
                content=iter([whole[:cut], whole[cut:]]),
                headers={**h, "Content-Length": str(len(whole))},
            )
            assert r.status_code == 201, (preamble[:20], cut, r.text)
            assert (r.json()["filename"], r.json()["size"]) == ("q.txt", 4)
    # "--boundary" inside a line is no delimiter, wherever the chunks split.
    evil = b"xx--" + BOUNDARY.encode() + b'\r\nContent-Disposition: form-data; name="file"; '
    evil += b'filename="evil"\r\n\r\nEVIL\r\n--' + BOUNDARY.encode() + b"--\r\n"
    for cut in range(1, len(BOUNDARY) + 8):
        r = client.post(
            "/v1/objects",
            content=iter([evil[:cut], evil[cut:]]),
            headers={**h, "Content-Length": str(len(evil))},
        )
        assert r.status_code == 422, (cut, r.text)
    no_boundary = b"only a preamble, no boundary at all\r\n" * 3
    r = client.post("/v1/objects", content=no_boundary, headers=h)
    assert r.status_code == 422 and "incomplete" in r.json()["message"], r.text


def test_a_body_short_of_its_content_length_is_not_stored(
    client: TestClient, a: Project, svc: Services
) -> None:
    """A server that ends the body early (the test client does) had the cut
    upload stored whole: 201 with the bytes that came."""
    h = bearer(a.admin)
    r = client.post("/v1/objects", content=b"abc", headers={**h, "Content-Length": "10"})
    assert r.status_code == 400 and "interrupted" in r.json()["message"], r.text
    body = form([("file", "q.txt", b"DATA")])
    long = {**h, **FORM, "Content-Length": str(len(body) + 5)}
    r = client.post("/v1/objects", content=body, headers=long)
    assert r.status_code == 400 and "interrupted" in r.json()["message"], r.text
    assert svc.storage.list() == []
    assert leftovers(svc) == []


def test_a_media_type_that_only_begins_like_multipart_is_a_raw_body(
    client: TestClient, a: Project
) -> None:
    """ "multipart/form-datax" was parsed as a form: 422 "malformed"."""
    h = {**bearer(a.admin), "Content-Type": "multipart/form-datax"}
    r = client.post("/v1/objects?filename=x.bin", content=b"raw bytes", headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["size"] == 9


def test_an_empty_upload_is_an_empty_object(client: TestClient, a: Project) -> None:
    obj = upload(client, a.admin, b"")
    assert (obj["size"], obj["filename"]) == (0, "")
    assert obj["checksum"] == checksum_of(b"")
    assert download(client, a.admin, obj["object_id"]) == b""


def test_a_declared_length_over_the_limit_is_413_before_reading(
    small: TestClient, a: Project, svc: Services
) -> None:
    assert upload(small, a.admin, b"x" * LIMIT)["size"] == LIMIT  # the limit itself is fine
    r = small.post("/v1/objects", content=b"x" * (LIMIT + 1), headers=bearer(a.admin))
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"
    assert len(svc.storage.list()) == 1
    assert leftovers(svc) == []


def test_a_chunked_body_growing_past_the_limit_is_413(
    small: TestClient, a: Project, svc: Services
) -> None:
    def body(n: int) -> Iterator[bytes]:
        for _ in range(n):
            yield b"y" * 300

    ok = small.post("/v1/objects", content=body(3), headers=bearer(a.admin))
    assert ok.status_code == 201 and ok.json()["size"] == 900
    r = small.post("/v1/objects", content=body(5), headers=bearer(a.admin))
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    assert [o["object_id"] for o in svc.storage.list()] == [ok.json()["object_id"]]
    assert leftovers(svc) == []


def test_a_multipart_file_past_the_limit_is_413(
    small: TestClient, a: Project, svc: Services
) -> None:
    # The declared length passes (forms get some slack); the file part does not.
    body = form([("file", "big.bin", b"z" * (LIMIT + 1))])
    r = small.post("/v1/objects", content=body, headers={**bearer(a.admin), **FORM})
    assert r.status_code == 413
    assert svc.storage.list() == []
    assert leftovers(svc) == []


def test_multipart_without_content_length_is_411(
    client: TestClient, a: Project, svc: Services
) -> None:
    body = form([("file", "a.bin", b"abc")])
    r = client.post("/v1/objects", content=iter([body]), headers={**bearer(a.admin), **FORM})
    assert r.status_code == 411 and r.json()["code"] == "length_required"
    assert svc.storage.list() == []


def test_bad_expired_and_forged_links_get_one_403(
    client: TestClient, a: Project, svc: Services
) -> None:
    obj_id = upload(client, a.admin, b"secret bytes")["object_id"]
    other = upload(client, a.admin, b"other bytes")["object_id"]
    assert isinstance(obj_id, int)
    secret = svc.storage.secret()
    past = int(time.time()) - 1
    future = int(time.time()) + 60
    links = {
        "no signature": f"/v1/objects/{obj_id}/content",
        "forged": f"/v1/objects/{obj_id}/content?expires={future}&sig={'0' * 64}",
        "expired": f"/v1/objects/{obj_id}/content?expires={past}&sig="
        + local.sign(secret, obj_id, past),
        "another object's": f"/v1/objects/{obj_id}/content?expires={future}&sig="
        + local.sign(secret, int(str(other)), future),
        "expiry not a number": f"/v1/objects/{obj_id}/content?expires=soon&sig=x",
        # isdigit() is true for these, int() refuses them: once a 500 without a token.
        "expiry in other digits": f"/v1/objects/{obj_id}/content?expires=%C2%B2&sig=x",
        "signature not ASCII": f"/v1/objects/{obj_id}/content?expires={future}&sig=%E2%82%AC",
        "other key": f"/v1/objects/{obj_id}/content?expires={future}&sig="
        + local.sign(b"not the key", obj_id, future),
    }
    answers = set()
    for what, link in links.items():
        r = client.get(link)
        assert r.status_code == 403, what
        assert set(r.json()) == {"code", "message", "request_id"}
        answers.add((r.json()["code"], r.json()["message"]))
    assert answers == {("forbidden", "invalid or expired link")}
    good = f"/v1/objects/{obj_id}/content?expires={future}&sig=" + local.sign(
        secret, obj_id, future
    )
    assert client.get(good).content == b"secret bytes"


def test_links_of_the_previous_key_stay_good_through_a_rotation(
    client: TestClient, a: Project, svc: Services
) -> None:
    obj_id = upload(client, a.admin, b"rotated")["object_id"]
    future = int(time.time()) + 60
    old, new, stranger = (c * 32 for c in "onx")

    def link(key: str) -> str:
        sig = local.sign(key.encode(), int(str(obj_id)), future)
        return f"/v1/objects/{obj_id}/content?expires={future}&sig={sig}"

    svc.storage._secret = new.encode()
    assert client.get(link(old)).status_code == 403  # no previous key: only the new one
    svc.storage.settings = dataclasses.replace(svc.settings, previous_secret_key=old)
    assert client.get(link(old)).content == b"rotated"
    assert client.get(link(new)).content == b"rotated"
    assert client.get(link(stranger)).status_code == 403


def test_a_corrupted_blob_is_cut_short(client: TestClient, a: Project, svc: Services) -> None:
    data = b"a" * (3 * 1024 * 1024 + 17)  # several chunks
    obj_id = upload(client, a.admin, data)["object_id"]
    row = svc.storage.get(int(str(obj_id)))
    blob = Path(svc.storage.backend(row["pool_id"]).root) / row["storage_key"]  # type: ignore[attr-defined]
    url = client.get(f"/v1/objects/{obj_id}/url", headers=bearer(a.admin)).json()["url"]
    damages = {
        "same size, other bytes": b"b" + data[1:],
        "truncated": data[:-1000],
        # Its recorded size of good bytes, then what grew: was sent whole, wrong.
        "grown": data[:-1000] + b"x" * 5000,
        "grown, the recorded part intact": data + b"x",
    }
    for what, damaged in damages.items():
        blob.write_bytes(damaged)
        got = client.get(url)
        assert got.headers["content-length"] == str(len(data)), what
        assert len(got.content) < len(data), what


def test_a_small_corrupted_blob_is_refused_and_logged(
    client: TestClient, a: Project, svc: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A blob of one chunk is read whole before the headers go: it answered
    a silent 404, as if the object were gone."""
    data = b"thumbnail bytes" * 10
    obj_id = upload(client, a.admin, data)["object_id"]
    row = svc.storage.get(int(str(obj_id)))
    blob = Path(svc.storage.backend(row["pool_id"]).root) / row["storage_key"]  # type: ignore[attr-defined]
    url = client.get(f"/v1/objects/{obj_id}/url", headers=bearer(a.admin)).json()["url"]
    blob.write_bytes(b"T" + data[1:])
    with caplog.at_level("ERROR", logger="hypermedia.api.routes.objects"):
        got = client.get(url)
    assert got.status_code == 500 and got.json()["code"] == "object_corrupt"
    assert data not in got.content
    assert f"object {obj_id}: download refused" in caplog.text
    # Cut short, as a whole or as a range over all of it: refused before the
    # headers too (it answered 200 with nothing after them).
    blob.write_bytes(data[:-10])
    for headers in ({}, {"Range": "bytes=0-"}, {"Range": "bytes=5-"}):
        got = client.get(url, headers=headers)
        assert got.status_code == 500 and got.json()["code"] == "object_corrupt", headers


def test_an_object_without_a_checksum_is_said_so_not_corrupt(
    client: TestClient, a: Project, svc: Services, tmp_path: Path
) -> None:
    """A legacy producer's row holds no checksum: its intact bytes were
    refused as "do not match its checksum", a corrupt object, in the API and
    to every job reading it."""
    from hypermedia.errors import JobError
    from hypermedia.worker.files import fetch_input
    from tests.harness import claimed_input

    obj_id = int(str(upload(client, a.admin, b"legacy bytes" * 10)["object_id"]))
    with svc.storage.db.tx() as tx:
        tx.update_object(obj_id, ["ready"], {"checksum": ""})
    url = client.get(f"/v1/objects/{obj_id}/url", headers=bearer(a.admin)).json()["url"]
    got = client.get(url)
    assert got.status_code == 500 and got.json()["code"] == "object_corrupt"
    assert "has no checksum to verify its bytes against" in got.json()["message"]
    job = claimed_input(svc.storage.get(obj_id), "image.thumbnail")
    with pytest.raises(JobError, match="has no checksum to verify its bytes against"):
        fetch_input(svc.storage, job, tmp_path)


def test_head_answers_the_download_headers_without_the_bytes(
    client: TestClient, a: Project, svc: Services, caplog: pytest.LogCaptureFixture
) -> None:
    obj = upload(client, a.admin, b"some bytes", filename="a.txt")
    url = client.get(f"/v1/objects/{obj['object_id']}/url", headers=bearer(a.admin)).json()["url"]
    got = client.head(url)
    assert got.status_code == 200 and got.content == b""
    assert got.headers["content-length"] == "10"
    assert (
        got.headers["content-disposition"]
        == "attachment; filename=\"a.txt\"; filename*=UTF-8''a.txt"
    )
    assert client.head(url.replace("sig=", "sig=0")).status_code == 403
    # A ready object's blob gone missing is lost data, for HEAD as for GET, a
    # part asked or not: a 500 and a log line (a bare 404 looked like a stale
    # link to the client, and the operator heard nothing).
    row = svc.storage.get(int(str(obj["object_id"])))
    blob = Path(svc.storage.backend(row["pool_id"]).root) / row["storage_key"]  # type: ignore[attr-defined]
    blob.unlink()
    with caplog.at_level("ERROR"):
        for headers in ({}, {"Range": "bytes=2-4"}):
            got = client.head(url, headers=headers)
            assert got.status_code == 500, headers
            got = client.get(url, headers=headers)
            assert got.status_code == 500 and got.json()["code"] == "object_corrupt", headers
            assert "missing" in got.json()["message"]
    assert f"object {obj['object_id']}: download refused (its blob is missing" in caplog.text
    # Collected since the link was made: gone, as any object no longer ready.
    with svc.storage.db.tx() as tx:
        tx.mark_deleting([int(str(obj["object_id"]))], "ready", svc.engine.clock())
    assert client.get(url).status_code == 404


def test_list_is_the_projects_own_newest_first_with_a_cursor(
    client: TestClient, a: Project, b: Project
) -> None:
    ids = [upload(client, a.admin, f"obj {i}".encode())["object_id"] for i in range(5)]
    upload(client, b.admin, b"b's object")
    seen, cursor = [], None
    while True:
        params: dict[str, str | int] = {"limit": 2, "state": "ready"}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/objects", params=params, headers=bearer(a.scoped["objects:read"]))
        assert page.status_code == 200, page.text
        seen += [o["object_id"] for o in page.json()["items"]]
        assert all(set(o) == set(PUBLIC_FIELDS) for o in page.json()["items"])
        cursor = page.json()["next_cursor"]
        if not cursor:
            break
    assert seen == sorted(ids, reverse=True)  # type: ignore[type-var]
    h = bearer(a.admin)
    assert client.get("/v1/objects", params={"state": "pending"}, headers=h).json() == {
        "items": [],
        "next_cursor": None,
    }
    assert client.get("/v1/objects", params={"state": "gone"}, headers=h).status_code == 422
    assert client.get("/v1/objects", params={"cursor": "!!"}, headers=h).status_code == 422


def test_another_projects_object_is_404_everywhere(
    client: TestClient, a: Project, b: Project
) -> None:
    obj_id = upload(client, a.admin, b"a's bytes")["object_id"]
    h = bearer(b.admin)
    for path in ("/v1/objects/{}", "/v1/objects/{}/url"):
        r = client.get(path.format(obj_id), headers=h)
        assert r.status_code == 404, path
        assert r.json()["code"] == "not_found"
        # Exactly what a missing object answers.
        missing = client.get(path.format(987654321), headers=h).json()["message"]
        assert missing.replace("987654321", str(obj_id)) == r.json()["message"]
    assert client.get("/v1/objects", headers=h).json()["items"] == []


def test_scopes_are_enforced(client: TestClient, a: Project) -> None:
    obj_id = upload(client, a.admin, b"bytes")["object_id"]
    reader, writer = a.scoped["objects:read"], a.scoped["objects:write"]
    r = client.post("/v1/objects", content=b"x", headers=bearer(reader))
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    for path in ("/v1/objects", f"/v1/objects/{obj_id}", f"/v1/objects/{obj_id}/url"):
        assert client.get(path, headers=bearer(writer)).status_code == 403, path
        assert client.get(path, headers=bearer(a.scoped["jobs:read"])).status_code == 403, path
        assert client.get(path, headers=bearer(reader)).status_code == 200, path
    assert client.post("/v1/objects", content=b"x").status_code == 401


def test_a_dead_uploads_temp_file_too_young_at_start_goes_later(
    svc: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server restarted within seconds of one killed mid-upload left its temp
    file (too young to judge at start) until the next start."""
    from hypermedia.api import app as api_app
    from hypermedia.leftovers import YOUNG_SECONDS

    monkeypatch.setattr(api_app, "SWEEP_SECONDS", 0.05)
    tmp = svc.settings.home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    dead = tmp / "upload-dead.part"  # nobody holds its lock
    dead.write_bytes(b"half an upload")
    with TestClient(create_app(svc)):
        time.sleep(0.3)
        assert dead.exists()  # young: it may be a live upload not locked yet
        old = time.time() - YOUNG_SECONDS - 1
        os.utime(dead, (old, old))
        deadline = time.monotonic() + 5
        while dead.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not dead.exists()


def test_a_long_file_name_is_cut_alike_raw_or_multipart(client: TestClient, a: Project) -> None:
    """`?filename=` of 300 characters was a 422 while the same name in a
    multipart part was cut to 255: both are cut now, keeping the extension."""
    name = "n" * 300 + ".txt"
    raw = upload(client, a.admin, b"some bytes", filename=name)
    r = client.post("/v1/objects", content=form([("file", name, b"some bytes")]), headers={
        **bearer(a.admin), **FORM})  # fmt: skip
    assert r.status_code == 201, r.text
    for obj in (raw, r.json()):
        assert obj["filename"] == "n" * 251 + ".txt"


def test_ids_in_paths_are_digits_only(client: TestClient, a: Project) -> None:
    """int() read "1_0" as object 10, and " 1", "+1" and "1.0" as 1."""
    ids = [int(str(upload(client, a.admin, b"x")["object_id"])) for _ in range(10)]
    n = str(ids[-1])  # two digits at least
    for raw in (f"{n[0]}_{n[1:]}", f"{n}.0", f"+{n}", f"%20{n}", "%EF%BC%91", f"0x{n}"):
        r = client.get(f"/v1/objects/{raw}", headers=bearer(a.admin))
        assert r.status_code == 422, (raw, r.status_code, r.text)
        r = client.get(f"/v1/objects/{raw}/content?expires=1&sig=x")
        assert r.status_code == 422, (raw, r.status_code)
    assert client.get(f"/v1/objects/{n}", headers=bearer(a.admin)).json()["object_id"] == ids[-1]
    # Whole numbers in query strings too: "?limit=1_0" was a page of 10.
    for route in ("/v1/objects", "/v1/jobs", "/v1/photos"):
        for raw in ("1_0", "5.0", "+5", "%205", "%EF%BC%95"):
            r = client.get(f"{route}?limit={raw}", headers=bearer(a.admin))
            assert r.status_code == 422, (route, raw, r.status_code)
        assert client.get(f"{route}?limit=5", headers=bearer(a.admin)).status_code == 200


def test_a_range_is_a_206_part_and_the_whole_a_checked_body(
    client: TestClient, a: Project, svc: Services
) -> None:
    """A player seeking or a download resumed asks for a part: it was always
    the whole body with a 200."""
    data = os.urandom(3 * 1024 * 1024 + 17)  # several chunks
    obj = upload(client, a.admin, data)
    url = client.get(f"/v1/objects/{obj['object_id']}/url", headers=bearer(a.admin)).json()["url"]
    whole = client.get(url)
    tag = whole.headers["etag"]
    assert whole.status_code == 200 and whole.headers["accept-ranges"] == "bytes"
    assert tag == '"' + str(obj["checksum"]).replace(":", "-") + '"'
    size = len(data)
    for asked, start, end in [
        ("bytes=0-99", 0, 99),
        ("bytes=2000000-", 2000000, size - 1),
        ("bytes=-10", size - 10, size - 1),
        ("bytes=1048570-2097160", 1048570, 2097160),  # across chunk boundaries
    ]:
        got = client.get(url, headers={"Range": asked})
        assert got.status_code == 206, asked
        assert got.headers["content-range"] == f"bytes {start}-{end}/{size}", asked
        assert got.headers["content-length"] == str(end - start + 1), asked
        assert got.content == data[start : end + 1], asked
    head = client.head(url, headers={"Range": "bytes=5-9"})
    assert head.status_code == 206 and head.headers["content-range"] == f"bytes 5-9/{size}"
    # Past the end: 416 with the size; If-Range of another version: all of it.
    past = client.get(url, headers={"Range": f"bytes={size}-"})
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{size}"
    assert past.json()["code"] == "range_not_satisfiable"
    other = client.get(url, headers={"Range": "bytes=0-9", "If-Range": '"sha256-00"'})
    assert other.status_code == 200 and other.content == data
    same = client.get(url, headers={"Range": "bytes=0-9", "If-Range": tag})
    assert same.status_code == 206 and same.content == data[:10]

    # A range over all of it is checked as the whole body is: cut short when damaged.
    row = svc.storage.get(int(str(obj["object_id"])))
    blob = Path(svc.storage.backend(row["pool_id"]).root) / row["storage_key"]  # type: ignore[attr-defined]
    blob.write_bytes(b"X" + data[1:])
    full = client.get(url, headers={"Range": "bytes=0-"})
    assert full.status_code == 206 and len(full.content) < size
    # A part cannot be checked against the checksum, but a blob whose size
    # is not the ledger's is refused before anything is sent.
    blob.write_bytes(data[:-1])
    cut = client.get(url, headers={"Range": "bytes=0-9"})
    assert cut.status_code == 500 and cut.json()["code"] == "object_corrupt"


def test_a_cache_revalidates_with_the_etag_and_a_version_is_insisted_on(
    client: TestClient, a: Project
) -> None:
    """If-None-Match naming the ETag is a 304 without a body (it was the
    whole body again); If-Match naming another version is a 412 (the body
    was sent)."""
    data = os.urandom(5000)
    obj = upload(client, a.admin, data)
    url = client.get(f"/v1/objects/{obj['object_id']}/url", headers=bearer(a.admin)).json()["url"]
    tag = client.head(url).headers["etag"]
    for method in ("GET", "HEAD"):
        for asked in (tag, f"W/{tag}", "*", f'"x", {tag}', f" {tag} , "):
            r = client.request(method, url, headers={"If-None-Match": asked})
            assert r.status_code == 304 and r.content == b"", (method, asked)
            assert r.headers["etag"] == tag and "content-length" not in r.headers
        for asked in ('"sha256-00"', tag[:-2] + '"', "garbage"):
            r = client.request(method, url, headers={"If-None-Match": asked})
            assert r.status_code == 200, (method, asked)
        for asked in ('"sha256-00"', f"W/{tag}", "garbage"):  # If-Match compares strongly
            r = client.request(method, url, headers={"If-Match": asked, "Range": "bytes=0-9"})
            assert r.status_code == 412, (method, asked)
            if method == "GET":
                assert r.json()["code"] == "precondition_failed"
    for asked in (tag, "*", f'"a", {tag}'):
        r = client.get(url, headers={"If-Match": asked, "Range": "bytes=0-9"})
        assert r.status_code == 206 and r.content == data[:10], asked
    # Several lines of a list header are one list (RFC 9110 §5.3).
    two = httpx.Headers([(b"if-none-match", b'"x"'), (b"if-none-match", tag.encode())])
    assert client.get(url, headers=two).status_code == 304
    two = httpx.Headers([(b"if-match", b'"x"'), (b"if-match", tag.encode())])
    assert client.get(url, headers=two).status_code == 200
    # If-Match is decided first (RFC 9110 §13.2.2); a bad link is still 403.
    both = client.get(url, headers={"If-Match": '"other"', "If-None-Match": tag})
    assert both.status_code == 412
    forged = client.get(url[:-4] + "0000", headers={"If-None-Match": tag})
    assert forged.status_code == 403


def test_one_listings_cursor_is_refused_by_another(client: TestClient, a: Project) -> None:
    """Job and object cursors had one form: an object cursor paged jobs from
    that id on (a 200 of another listing's page)."""
    h = bearer(a.admin)
    for i in range(3):
        upload(client, a.admin, f"obj {i}".encode())
        assert (
            client.post("/v1/jobs", json={"job_type": "debug.noop"}, headers=h).status_code == 201
        )
    objects = client.get("/v1/objects", params={"limit": 1}, headers=h).json()["next_cursor"]
    jobs = client.get("/v1/jobs", params={"limit": 1}, headers=h).json()["next_cursor"]
    photos = client.get("/v1/photos", params={"cursor": objects}, headers=h)
    for path, cursor in (
        ("/v1/jobs", objects),
        ("/v1/objects", jobs),
        ("/v0/processing-jobs", objects),
    ):
        r = client.get(path, params={"cursor": cursor}, headers=h)
        assert r.status_code == 422, (path, r.text)
        assert "cursor is not valid" in r.text
    assert photos.status_code == 422
    assert client.get("/v1/jobs", params={"cursor": jobs}, headers=h).status_code == 200
    assert client.get("/v1/objects", params={"cursor": objects}, headers=h).status_code == 200
