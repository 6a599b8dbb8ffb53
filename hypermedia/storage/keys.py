"""Object keys: opaque, server-made, and checked before they touch a path.

A key is ``objects/{object_id}/{role}.{ext}``.  Nothing in it comes from a user:
the role is one of ours and the extension follows the detected media type.  A
user's file name is kept only as display metadata, cleaned.
"""

from __future__ import annotations

import mimetypes
import re
import unicodedata
import uuid
from urllib.parse import quote

from hypermedia.storage.base import UnsafeKey

_ROLE = re.compile(r"^[a-z][a-z0-9_-]{0,29}\Z")
_EXT = re.compile(r"^[a-z0-9]{1,10}\Z")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")

# Extensions mimetypes gets wrong or leaves to chance on some systems.
_EXT_BY_MIME = {
    "image/jpeg": "jpg",
    "image/png": "png",
    "image/gif": "gif",
    "image/webp": "webp",
    "image/avif": "avif",
    "image/heic": "heic",
    "image/tiff": "tif",
    "application/pdf": "pdf",
    "text/plain": "txt",
    "application/json": "json",
    "video/mp4": "mp4",
    "application/octet-stream": "bin",
}


def extension_for(mime: str) -> str:
    ext = _EXT_BY_MIME.get(mime)
    if ext is None:
        guess = mimetypes.guess_extension(mime or "", strict=False) or ".bin"
        ext = guess.lstrip(".").lower()
    return ext if _EXT.match(ext) else "bin"


def object_key(object_id: int, role: str, mime: str) -> str:
    if not _ROLE.match(role):
        raise UnsafeKey(f"invalid role {role!r}")
    return check_key(f"objects/{int(object_id)}/{role}.{extension_for(mime)}")


def object_prefix(object_id: int) -> str:
    """Where every blob of one object lives: ``objects/{id}/`` (no other object's)."""
    return f"objects/{int(object_id)}/"


# Reserved for the blobs ``pools add`` writes and deletes to check a pool:
# never an object's (those are under ``objects/``), so GC and scrubs never see them.
PROBE_PREFIX = "probes/"


def probe_key() -> str:
    """A fresh key under PROBE_PREFIX: two checks at once never meet."""
    return f"{PROBE_PREFIX}check-{uuid.uuid4().hex}"


def check_key(key: str) -> str:
    """Return ``key`` if it is a relative path of plain segments; raise UnsafeKey otherwise."""
    if not key or len(key) > 500 or key.startswith("/") or "\\" in key or "\x00" in key:
        raise UnsafeKey("unsafe storage key")
    parts = key.split("/")
    if any(p in ("", ".", "..") or not _SEGMENT.match(p) for p in parts):
        raise UnsafeKey("unsafe storage key")
    return key


def display_name(name: str | None, *, local: bool = False) -> str:
    """A user's file name made safe to store and show: base name, no controls, ≤ 255.

    A browser on Windows may send an upload's whole path, ``C:\\photos\\a.png``:
    its backslashes part folders.  A ``local`` name (a file on this machine,
    named by the CLI) is one file's name already, where a backslash is a
    character like any other (``a\\b.png`` is not ``b.png``)."""
    if not name:
        return ""
    if not local:
        name = name.replace("\\", "/")
    name = unicodedata.normalize("NFC", name.rsplit("/", 1)[-1])
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C")
    name = name.strip().strip(".")
    if len(name) <= MAX_NAME:
        return name
    # Cut from the stem: the extension is what tells a type at a glance.
    stem, dot, ext = name.rpartition(".")
    if dot and 0 < len(ext) <= 16:
        return stem[: MAX_NAME - len(ext) - 1] + "." + ext
    return name[:MAX_NAME]


MAX_NAME = 255


def attachment(filename: str | None) -> str:
    """A Content-Disposition that downloads the file under its name: the name
    in UTF-8 (RFC 5987), and first an ASCII approximation for clients that
    read only ``filename=`` (``curl -OJ`` saved every file as "content")."""
    if not filename:
        return "attachment"
    letters = unicodedata.normalize("NFKD", filename)  # é: e and its accent
    plain = "".join(c for c in letters if not unicodedata.combining(c))
    plain = re.sub(r"[^A-Za-z0-9 ._()+,=@-]", "_", plain).strip(" .") or "download"
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename, safe='')}"
