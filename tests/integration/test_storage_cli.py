"""hypermedia objects / pools / gc as real subprocesses, and signed downloads
served by a real ``hypermedia serve``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from tests.harness import checksum_of, cli_env, hypermedia, start_serve, stop
from tests.media import png


def _ok(*args: str, url: str, home: Path) -> str:
    proc = hypermedia(*args, url=url, home=home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_objects_put_get_ls_show(driver: Driver, tmp_path: Path) -> None:
    url, home = driver.url, tmp_path / "home"
    pic = tmp_path / "holiday photo.png"
    pic.write_bytes(png(7, 5))
    row = json.loads(_ok("objects", "put", str(pic), "--json", url=url, home=home))
    assert (row["state"], row["mime_type"], row["width"], row["height"]) == (
        "ready",
        "image/png",
        7,
        5,
    )
    assert row["filename"] == "holiday photo.png" and "storage_key" not in row
    many = []
    for i in range(3):
        many.append(tmp_path / f"n{i}.bin")
        many[-1].write_bytes(os.urandom(1000 + i))
    rows = json.loads(_ok("objects", "put", *map(str, many), "--json", url=url, home=home))
    assert [r["size"] for r in rows] == [1000, 1001, 1002]

    out = tmp_path / "back.png"
    # A file named as the old temporary name was, and a symlink another user
    # could leave there: neither is touched (one was removed, the other
    # written through).
    (tmp_path / ".back.png.part").write_text("precious")
    victim = tmp_path / "victim.txt"
    victim.write_text("theirs")
    (tmp_path / ".again.png.part").symlink_to(victim)
    _ok("objects", "get", str(row["object_id"]), "-o", str(out), url=url, home=home)
    _ok(
        "objects",
        "get",
        str(row["object_id"]),
        "-o",
        str(tmp_path / "again.png"),
        url=url,
        home=home,
    )
    assert out.read_bytes() == (tmp_path / "again.png").read_bytes() == pic.read_bytes()
    assert (tmp_path / ".back.png.part").read_text() == "precious"
    assert victim.read_text() == "theirs" and not (tmp_path / "again.png").is_symlink()
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as cp makes it
    assert not list(tmp_path.glob(".hypermedia-*"))
    raw = subprocess.run(
        [sys.executable, "-m", "hypermedia", "objects", "get", str(rows[0]["object_id"])],
        env=cli_env(url, home),
        capture_output=True,
        timeout=60,
    )
    assert raw.returncode == 0 and raw.stdout == many[0].read_bytes()
    listed = json.loads(_ok("objects", "ls", "--json", url=url, home=home))
    assert {r["object_id"] for r in listed} == {row["object_id"], *(r["object_id"] for r in rows)}
    shown = json.loads(_ok("objects", "show", str(row["object_id"]), "--json", url=url, home=home))
    assert shown["checksum"] == checksum_of(pic.read_bytes())
    human = _ok("objects", "show", str(rows[0]["object_id"]), url=url, home=home)
    assert "pages: -" in human and "None" not in human  # not Python's None (QA)


def test_corrupted_download_is_refused_and_not_written(driver: Driver, tmp_path: Path) -> None:
    url, home = driver.url, tmp_path / "home"
    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(300_000))
    row = json.loads(_ok("objects", "put", str(src), "--json", url=url, home=home))
    blob = next((home / "storage" / "objects" / str(row["object_id"])).iterdir())
    blob.write_bytes(os.urandom(300_000))
    out = tmp_path / "out.bin"
    oid = row["object_id"]
    proc = hypermedia("objects", "get", str(oid), "-o", str(out), url=url, home=home)
    assert proc.returncode == 1
    assert "checksum" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".hypermedia-*"))
    # Which object, pool and key (a restore's needs): it was "no blob under this key".
    key = blob.relative_to(home / "storage").as_posix()
    assert f"error: object {oid}: the stored bytes do not match" in proc.stderr
    assert f"(pool local, key {key}); `hypermedia objects verify`" in proc.stderr
    blob.unlink()
    gone = hypermedia("objects", "get", str(oid), url=url, home=home)
    assert gone.returncode == 1
    assert f"error: object {oid}: no blob under its key (pool local, key {key})" in gone.stderr
    blob.mkdir()  # a folder planted where the blob was: never followed, and named
    planted = hypermedia("objects", "get", str(oid), url=url, home=home)
    assert planted.returncode == 1 and f"(pool local, key {key})" in planted.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pools", "add", "x", "ftp://host/x"], "file: or s3://"),
        (["pools", "add", "x", "s3://AKIA:secret@bucket"], "credentials"),
        (["objects", "get", "999999"], "not found"),
        (["objects", "put", "/nonexistent/file"], "does not exist"),
        (["jobs", "submit", "debug.copy", "--object", "424242"], "does not exist"),
    ],
)
def test_storage_bad_requests(
    driver: Driver, tmp_path: Path, args: list[str], message: str
) -> None:
    proc = hypermedia(*args, url=driver.url, home=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr and "secret" not in proc.stderr


def test_pools_and_gc(driver: Driver, tmp_path: Path) -> None:
    url, home = driver.url, tmp_path / "home"
    archive = tmp_path / "archive"
    _ok("pools", "add", "archive", f"file://{archive}", url=url, home=home)
    src = tmp_path / "a.txt"
    src.write_text("hello")
    row = json.loads(
        _ok("objects", "put", str(src), "--pool", "archive", "--json", url=url, home=home)
    )
    pools = json.loads(_ok("pools", "ls", "--json", url=url, home=home))
    assert {p["name"] for p in pools} >= {"archive"}
    (line,) = [x for x in _ok("pools", "ls", url=url, home=home).splitlines() if "archive" in x]
    assert "(shared)" in line and "None" not in line  # a pool of every project
    assert (archive / "objects" / str(row["object_id"]) / "original.txt").read_text() == "hello"
    report = json.loads(
        hypermedia(
            "gc", "run-once", "--json", url=url, home=home, HYPERMEDIA_GC_UNREFERENCED_SECONDS="0"
        ).stdout
    )
    assert report["deleted"] == 1
    assert not (archive / "objects" / str(row["object_id"])).exists()


def test_pools_set_url_looks_past_a_blob_lost_at_both_urls(driver: Driver, tmp_path: Path) -> None:
    """One of the pool's oldest blobs lost already (as `objects verify` says)
    made the same store, by another URL, look like another store: only
    --no-check, which skips the write probe too, got past it."""
    url, home = driver.url, tmp_path / "home"
    store = tmp_path / "store"
    _ok("pools", "add", "archive", f"file://{store}", url=url, home=home)
    rows = []
    for i in range(3):
        src = tmp_path / f"{i}.txt"
        src.write_text(f"file {i}")
        put = _ok("objects", "put", str(src), "--pool", "archive", "--json", url=url, home=home)
        rows.append(json.loads(put))
    (store / "objects" / str(rows[0]["object_id"]) / "original.txt").unlink()
    alias = tmp_path / "alias"
    alias.symlink_to(store)  # the same store under another name
    _ok("pools", "set-url", "archive", f"file://{alias}", url=url, home=home)
    # Another store still is one: it lacks blobs the current URL has.
    elsewhere = tmp_path / "elsewhere"
    wrong = hypermedia("pools", "set-url", "archive", f"file://{elsewhere}", url=url, home=home)
    said = " ".join(wrong.stderr.split())
    assert wrong.returncode == 1 and f"lacks object {rows[1]['object_id']}'s blob" in said, said


def test_pools_set_url_moves_a_pool_with_its_objects(driver: Driver, tmp_path: Path) -> None:
    """The store moved (here: the folder): `pools set-url` points the pool at
    it, checked as `pools add` checks one, and its objects read from there."""
    url, home = driver.url, tmp_path / "home"
    old, new = tmp_path / "old", tmp_path / "new"
    _ok("pools", "add", "archive", f"file://{old}", url=url, home=home)
    src = tmp_path / "a.txt"
    src.write_text("hello")
    row = json.loads(
        _ok("objects", "put", str(src), "--pool", "archive", "--json", url=url, home=home)
    )
    old.rename(new)
    # A writable folder without the pool's blobs (a typo): refused, URL unchanged.
    elsewhere = tmp_path / "elsewhere"
    wrong = hypermedia("pools", "set-url", "archive", f"file://{elsewhere}", url=url, home=home)
    said = " ".join(wrong.stderr.split())
    assert wrong.returncode == 1 and f"lacks object {row['object_id']}'s blob" in said, said
    said = _ok("pools", "set-url", "archive", f"file://{new}", url=url, home=home)
    assert "now at the new URL: running workers and servers move to it within 30 s" in " ".join(
        said.split()
    )
    got = tmp_path / "got.txt"
    _ok("objects", "get", str(row["object_id"]), "-o", str(got), url=url, home=home)
    assert got.read_text() == "hello"
    (pool,) = [p for p in json.loads(_ok("pools", "ls", "--json", url=url, home=home))
               if p["name"] == "archive"]  # fmt: skip
    assert pool["backend_url"] == f"file://{new}"
    # --no-check takes the operator's word for it.
    _ok("pools", "set-url", "archive", f"file://{elsewhere}", "--no-check", url=url, home=home)
    _ok("pools", "set-url", "archive", f"file://{new}", url=url, home=home)
    for args, code, words in (
        (["pools", "set-url", "nope", f"file://{new}"], 2, "no pool named 'nope'"),
        (["pools", "set-url", "local", f"file://{new}"], 1, "it has no URL to set"),
        (["pools", "set-url", "archive", "s3://a"], 2, "bucket name"),
    ):
        done = hypermedia(*args, url=url, home=home)
        assert done.returncode == code and words in " ".join(done.stderr.split()), done.stderr


def test_signed_download_urls_served_by_serve(tmp_path: Path) -> None:
    home = tmp_path / "embedded"
    server, base = start_serve(tmp_path, home)
    try:
        src = tmp_path / "résumé final.pdf"
        data = b"%PDF-1.4\n" + os.urandom(2_500_000)
        src.write_bytes(data)
        row = json.loads(_ok("objects", "put", str(src), "--json", url="", home=home))
        link = _ok("objects", "url", str(row["object_id"]), "--base-url", base, url="", home=home)
        bare = hypermedia("objects", "url", str(row["object_id"]), url="", home=home)
        assert bare.stdout.startswith(f"/v1/objects/{row['object_id']}/content?")
        assert "give --base-url" in bare.stderr  # a relative link says so
        with urllib.request.urlopen(link.strip(), timeout=10) as r:
            assert r.read() == data
            assert r.headers["Content-Type"] == "application/pdf"
            assert (
                "filename*=UTF-8''r%C3%A9sum%C3%A9%20final.pdf" in r.headers["Content-Disposition"]
            )
        for forged in (
            link.strip().replace("sig=", "sig=0"),
            link.strip().replace(f"/{row['object_id']}/", f"/{row['object_id'] + 1}/"),
            f"{base}/v1/objects/{row['object_id']}/content?expires=9999999999&sig=abc",
        ):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(forged, timeout=10)
            assert err.value.code == 403
            err.value.close()
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
