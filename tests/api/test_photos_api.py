"""/v1/photos on every database: upload, list, show, copy, move, update, delete,
project scoping and scopes."""

from __future__ import annotations

import io
import uuid
from typing import Any

from fastapi.testclient import TestClient

from hypermedia.db.schema_storage import photos as photo_rows
from hypermedia.photos import PhotoBridge
from hypermedia.services import Services
from tests.api.conftest import Project, _project, bearer
from tests.harness import checksum_of
from tests.media import png

Row = dict[str, Any]


def add(client: TestClient, token: str, data: bytes | None = None, **params: str) -> Row:
    body = png(4, 3) if data is None else data
    r = client.post("/v1/photos", content=body, params=params, headers=bearer(token))
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_upload_then_show_with_facts_and_urls(client: TestClient, a: Project) -> None:
    data = png(7, 5)
    photo = add(
        client, a.scoped["objects:write"], data, album="trips", title="Beach", filename="b.png"
    )
    assert (photo["album"], photo["title"], photo["project_id"]) == ("trips", "Beach", "proj-a")
    assert (photo["mime_type"], photo["size"]) == ("image/png", len(data))
    assert (photo["width"], photo["height"]) == (7, 5)
    shown = client.get(f"/v1/photos/{photo['id']}", headers=bearer(a.scoped["objects:read"]))
    assert shown.status_code == 200
    url = shown.json()["url"]
    assert url.startswith("http://testserver/v1/objects/")
    assert client.get(url).content == data  # the original, through its signed URL
    obj = client.get(f"/v1/objects/{photo['object_id']}", headers=bearer(a.admin)).json()
    assert obj["filename"] == "b.png"
    assert obj["checksum"] == checksum_of(data)
    assert "storage_key" not in str(shown.json())


def test_multipart_upload_with_album_and_title_fields(client: TestClient, a: Project) -> None:
    data = png(2, 2)
    h = bearer(a.admin)
    files = {"file": ("cat.png", data, "image/png")}
    r = client.post("/v1/photos", files=files, data={"album": "pets", "title": "Cat"}, headers=h)
    assert r.status_code == 201, r.text
    assert (r.json()["album"], r.json()["title"], r.json()["size"]) == ("pets", "Cat", len(data))
    both = client.post(
        "/v1/photos", files=files, data={"album": "pets"}, params={"album": "x"}, headers=h
    )
    assert both.status_code == 422
    unknown = client.post("/v1/photos", files=files, data={"owner": "me"}, headers=h)
    assert unknown.status_code == 422


def test_what_is_not_an_image_is_422_and_not_kept(
    client: TestClient, a: Project, svc: Services
) -> None:
    r = client.post("/v1/photos", content=b"plain text", headers=bearer(a.admin))
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"
    assert svc.storage.list(state="ready") == []
    assert client.get("/v1/photos", headers=bearer(a.admin)).json()["items"] == []


def test_list_filters_by_album_and_pages(client: TestClient, a: Project, b: Project) -> None:
    h = bearer(a.admin)
    ids = [add(client, a.admin, album="one")["id"] for _ in range(3)]
    other = add(client, a.admin, album="two")["id"]
    add(client, b.admin, album="one")
    seen, cursor = [], None
    while True:
        params: dict[str, str | int] = {"album": "one", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/photos", params=params, headers=h)
        assert page.status_code == 200, page.text
        seen += [p["id"] for p in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 3
    everything = client.get("/v1/photos", headers=h).json()["items"]
    assert {p["id"] for p in everything} == {*ids, other}
    assert client.get("/v1/photos", params={"cursor": "!!"}, headers=h).status_code == 422


def test_a_url_whose_escapes_are_not_utf8_is_refused(client: TestClient, a: Project) -> None:
    # Decoded, %FF became U+FFFD: the photos of an album named "\ufffd" were listed.
    add(client, a.admin, album="\ufffd")
    h = bearer(a.admin)
    for url in ("/v1/photos?album=%FF", "/v1/photos?album=a%C3", "/v1/photos/%FF"):
        r = client.get(url, headers=h)
        assert r.status_code == 422, (url, r.text)
        assert "not UTF-8" in r.json()["details"][0]["msg"], r.text
    assert client.get("/v1/photos?album=%FF").status_code == 401  # who asks comes first
    good = client.get("/v1/photos?album=%EF%BF%BD+", headers=h)  # "\ufffd " is UTF-8
    assert good.status_code == 200 and good.json()["items"] == []
    assert len(client.get("/v1/photos?album=%EF%BF%BD", headers=h).json()["items"]) == 1
    page = client.get("/ui/jobs?status=%FF", headers=h, follow_redirects=False)
    assert page.status_code in (303, 422)  # the dashboard: log in first, then its 422 page


def test_copy_move_update_delete(client: TestClient, a: Project) -> None:
    h = bearer(a.scoped["objects:write"])
    src = add(client, a.admin, album="a", title="t")
    r = client.post(f"/v1/photos/{src['id']}/copy", json={"album": "b"}, headers=h)
    assert r.status_code == 201, r.text
    copy = r.json()
    assert copy["id"] != src["id"] and (copy["album"], copy["title"]) == ("b", "t")
    assert copy["object_id"] == src["object_id"]  # metadata only: the same object
    plain = client.post(f"/v1/photos/{src['id']}/copy", headers=h)
    assert plain.status_code == 201 and plain.json()["album"] == "a"

    moved = client.post(f"/v1/photos/{copy['id']}/move", json={"album": "c"}, headers=h)
    assert moved.status_code == 200 and moved.json()["album"] == "c"
    assert client.post(f"/v1/photos/{copy['id']}/move", json={}, headers=h).status_code == 422

    patched = client.patch(f"/v1/photos/{src['id']}", json={"title": "New"}, headers=h)
    assert patched.status_code == 200
    assert (patched.json()["title"], patched.json()["album"]) == ("New", "a")
    bad = client.patch(f"/v1/photos/{src['id']}", json={"title": "x\x00y"}, headers=h)
    assert bad.status_code == 422
    assert client.patch(f"/v1/photos/{src['id']}", json={"colour": 1}, headers=h).status_code == 422

    assert client.delete(f"/v1/photos/{src['id']}", headers=h).status_code == 204
    assert client.get(f"/v1/photos/{src['id']}", headers=bearer(a.admin)).status_code == 404
    # The copy still shows its (shared) original.
    kept = client.get(f"/v1/photos/{copy['id']}", headers=bearer(a.admin)).json()
    assert kept["object_id"] == src["object_id"] and kept["url"]


def test_another_projects_photo_is_404_everywhere(
    client: TestClient, a: Project, b: Project
) -> None:
    photo = add(client, a.admin, album="private", title="mine")
    pid, h = photo["id"], bearer(b.admin)
    calls = {
        "show": lambda: client.get(f"/v1/photos/{pid}", headers=h),
        "copy": lambda: client.post(f"/v1/photos/{pid}/copy", json={}, headers=h),
        "move": lambda: client.post(f"/v1/photos/{pid}/move", json={"album": "x"}, headers=h),
        "update": lambda: client.patch(f"/v1/photos/{pid}", json={"title": "x"}, headers=h),
        "delete": lambda: client.delete(f"/v1/photos/{pid}", headers=h),
    }
    for what, call in calls.items():
        r = call()
        assert r.status_code == 404, what
        assert r.json() == {**r.json(), "code": "not_found", "message": f"photo {pid} not found"}
    assert client.get("/v1/photos", headers=h).json()["items"] == []
    # Nothing changed, and the object under it is as hidden as the photo.
    after = client.get(f"/v1/photos/{pid}", headers=bearer(a.admin)).json()
    assert (after["album"], after["title"]) == ("private", "mine")
    assert client.get(f"/v1/objects/{photo['object_id']}/url", headers=h).status_code == 404
    assert len(client.get("/v1/photos", headers=bearer(a.admin)).json()["items"]) == 1


def test_scopes_are_enforced(client: TestClient, a: Project) -> None:
    pid = add(client, a.admin)["id"]
    reader = bearer(a.scoped["objects:read"])
    assert client.post("/v1/photos", content=png(), headers=reader).status_code == 403
    assert client.post(f"/v1/photos/{pid}/copy", headers=reader).status_code == 403
    move = client.post(f"/v1/photos/{pid}/move", json={"album": "x"}, headers=reader)
    assert move.status_code == 403 and move.json()["code"] == "forbidden"
    assert client.patch(f"/v1/photos/{pid}", json={"title": "x"}, headers=reader).status_code == 403
    assert client.delete(f"/v1/photos/{pid}", headers=reader).status_code == 403
    for token in (a.scoped["objects:write"], a.scoped["jobs:read"]):
        assert client.get(f"/v1/photos/{pid}", headers=bearer(token)).status_code == 403
        assert client.get("/v1/photos", headers=bearer(token)).status_code == 403
    assert client.get(f"/v1/photos/{pid}", headers=reader).status_code == 200


def test_hostile_ids_and_filters_are_422_not_500(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    for path in ("/v1/photos/a%00b", "/v1/photos/" + "x" * 37, "/v1/photos/%E2%82%AC"):
        r = client.get(path, headers=h)
        assert r.status_code == 422, path
        assert r.json()["code"] == "invalid_request"
    for control in ("\x00", "\x85"):  # C0 and C1
        listed = client.get("/v1/photos", params={"album": f"a{control}"}, headers=h)
        assert listed.status_code == 422
    assert (
        client.get("/v1/photos/00000000-0000-0000-0000-000000000000", headers=h).status_code == 404
    )


def test_variants_waiting_on_a_credit_budget_say_why(
    client: TestClient, a: Project, svc: Services
) -> None:
    """Over its project's budget a photo is kept, its variant jobs are not made
    yet: the photo says why they wait instead of a bare "queued" forever."""
    r = client.put("/v1/credits/budget", json={"budget_credits": 0}, headers=bearer(a.admin))
    assert r.status_code == 200, r.text
    photo = add(client, a.admin, album="tight")
    assert {v["status"] for v in photo["variants"].values()} == {"queued"}
    PhotoBridge(svc.photos).run_once()  # refused again: recorded on the row
    shown = client.get(f"/v1/photos/{photo['id']}", headers=bearer(a.admin)).json()
    for variant in shown["variants"].values():
        assert variant["status"] == "queued" and variant["job_id"] is None
        assert "credit budget" in variant["error"]


def test_a_legacy_photo_without_a_project_is_the_default_projects(
    client: TestClient, a: Project, svc: Services
) -> None:
    """Shown to the default project's tokens, so listed to them as well (and to no
    one else), with the project it is shown under."""
    default = _project(svc, "default")
    obj = svc.storage.put(io.BytesIO(png(5, 4)))
    pid = str(uuid.uuid4())
    with svc.engine.db.tx() as tx:  # what a legacy producer writes: no project
        tx.conn.execute(photo_rows.insert().values(photo_id=pid, album="old"))
        tx.bind(pid, obj["object_id"], "original")
    h = bearer(default.admin)
    shown = client.get(f"/v1/photos/{pid}", headers=h)
    assert shown.status_code == 200 and shown.json()["project_id"] == "default"
    listed = client.get("/v1/photos", headers=h).json()["items"]
    assert [(p["id"], p["project_id"], p["width"]) for p in listed] == [(pid, "default", 5)]
    assert client.get("/v1/photos", params={"album": "old"}, headers=h).json()["items"]
    assert client.get(f"/v1/photos/{pid}", headers=bearer(a.admin)).status_code == 404
    assert client.get("/v1/photos", headers=bearer(a.admin)).json()["items"] == []


def test_a_write_only_token_changes_photos_but_gets_no_urls(client: TestClient, a: Project) -> None:
    """PATCH of {} (or a copy, a move) answered the photo with working signed
    links: an upload-only token read what its scope does not let it see."""
    pid = add(client, a.admin, album="secret")["id"]
    writer = bearer(a.scoped["objects:write"])
    answers = {
        "upload": client.post("/v1/photos", content=png(), headers=writer),
        "patch": client.patch(f"/v1/photos/{pid}", json={}, headers=writer),
        "copy": client.post(f"/v1/photos/{pid}/copy", json={}, headers=writer),
        "move": client.post(f"/v1/photos/{pid}/move", json={"album": "s"}, headers=writer),
    }
    for what, r in answers.items():
        assert r.status_code in (200, 201), (what, r.text)
        photo = r.json()
        assert (photo["url"], photo["thumb_url"], photo["preview_url"]) == (None,) * 3, what
        assert all(o["url"] is None for o in photo["objects"].values()), what
        assert "sig=" not in r.text, what
    both = {**writer, "Authorization": f"Bearer {a.admin}"}
    assert client.patch(f"/v1/photos/{pid}", json={}, headers=both).json()["url"]
