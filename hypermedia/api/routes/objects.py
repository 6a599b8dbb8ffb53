"""``/v1/objects``: upload, list, show, signed URLs, and the signed download itself.

An upload streams the request body to a temp file under ``HOME/tmp``, counting
bytes against ``max_upload_bytes`` (never the whole body in memory), then hands
the file to the ledger.  The download (``/content``) takes no token: its HMAC
signature is the capability, and a bad, expired or forged one gets one answer.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO
from urllib.parse import parse_qs, unquote_to_bytes, urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Send

from hypermedia import leftovers
from hypermedia.api.deps import Id, Whole, link_base, owned, scoped, services
from hypermedia.api.errors import ApiError
from hypermedia.api.openapi import upload_body
from hypermedia.api.paging import decode_cursor, page
from hypermedia.api.ranges import RangeNotSatisfiable, byte_range, etag, precondition
from hypermedia.api.strict_json import StrictJSONRoute, is_head
from hypermedia.auth.tokens import Principal
from hypermedia.config import Settings
from hypermedia.db.schema_storage import OBJECT_STATES
from hypermedia.errors import Forbidden, HypermediaError, InvalidRequest, NotFound
from hypermedia.parse import ascii_int
from hypermedia.services import Services
from hypermedia.storage.base import (
    BlobMissing,
    ChecksumMismatch,
    ChecksumMissing,
    StorageUnavailable,
    unavailable,
)
from hypermedia.storage.keys import attachment
from hypermedia.storage.ledger import Storage, Ticket

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/objects", tags=["objects"], route_class=StrictJSONRoute)

Row = dict[str, Any]
PUBLIC_FIELDS = (
    "object_id",
    "filename",
    "mime_type",
    "size",
    "width",
    "height",
    "pages",
    "duration_ms",
    "checksum",
    "state",
    "created_at",
    "project_id",
)
CHUNK = 1024 * 1024
# A multipart body carries boundaries, part headers and small text fields
# besides the file: the declared length may pass the cap by this much.
FORM_OVERHEAD = 64 * 1024
MAX_FIELD_BYTES = 4096


def public_object(row: Row) -> Row:
    """What an object shows of itself: no storage key, no pool."""
    return {k: row.get(k) for k in PUBLIC_FIELDS}


def owned_object(svc: Services, object_id: int, principal: Principal) -> Row:
    row = svc.storage.get(object_id)
    owned(row, principal, "object", object_id)
    return row


# -- receiving an upload -------------------------------------------------------------


@dataclass
class Upload:
    """A received body: the file on disk, its name, and the form's text fields."""

    path: Path
    size: int = 0
    filename: str = ""
    fields: dict[str, str] = field(default_factory=dict)


# The rest of a refused upload's body is never read: the connection closes
# with the answer (kept open, it waited on a client's bytes with no timeout).
_CLOSE = {"Connection": "close"}


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the upload is larger than the {limit}-byte limit", headers=_CLOSE)


def _declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    size = ascii_int(raw)
    if size is None:
        raise ApiError(400, "Content-Length is not a number")
    return size


def _is_multipart(request: Request) -> bool:
    # The media type itself: "multipart/form-datax" is a raw body of that type.
    media = request.headers.get("content-type", "").partition(";")[0]
    return media.strip().lower() == "multipart/form-data"


@contextlib.asynccontextmanager
async def receive_upload(
    request: Request, settings: Settings, text_fields: frozenset[str] = frozenset()
) -> AsyncIterator[Upload]:
    """The body (raw, or the ``file`` part of a multipart form) in a temp file.

    The file is removed on the way out, whatever happened; ``text_fields``
    names the small form fields a multipart body may carry besides ``file``.
    """
    limit = settings.max_upload_bytes
    multipart = _is_multipart(request)
    declared = _declared_length(request)
    if multipart and declared is None:
        # A form's length is known to any client that builds one; requiring
        # it lets an oversized form be refused before a byte of it is read.
        raise ApiError(411, "a multipart upload needs a Content-Length header")
    if declared is not None and declared > limit + (FORM_OVERHEAD if multipart else 0):
        raise _too_large(limit)
    path, lock = _temp_file(settings.home / "tmp")
    upload = Upload(path)
    try:
        try:
            with open(upload.path, "wb") as out:
                chunks = _chunks(request, settings.upload_idle_seconds)
                if multipart:
                    got = await _receive_form(request, chunks, out, upload, limit, text_fields)
                else:
                    got = await _receive_raw(chunks, out, upload, limit)
            if declared is not None and got != declared:
                # uvicorn keeps to the length itself; a server that ended the
                # body early had a cut upload stored as a whole one.
                raise ClientDisconnect
        except ClientDisconnect:
            raise ApiError(400, "the upload was interrupted") from None
        except InvalidRequest as exc:  # a form refused part-way: the rest goes unread
            raise ApiError(422, str(exc), headers=_CLOSE) from None
        except OSError as exc:
            raise _disk_error(exc) from None
        yield upload
    finally:
        with contextlib.suppress(FileNotFoundError):
            upload.path.unlink()
        os.close(lock)


TEMP_PATTERN = "upload-*.part"


def _temp_file(tmp_dir: Path) -> tuple[Path, int]:
    """A new temp file, and the descriptor of its lock (leftovers.py): held until
    the upload is done, so a server killed mid-upload leaves a file the next
    one removes (``sweep_uploads``)."""
    try:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="upload-", suffix=".part", dir=tmp_dir)
        os.close(fd)
        return Path(name), leftovers.hold(Path(name))
    except OSError as exc:
        raise _disk_error(exc) from None


def sweep_uploads(home: Path) -> int:
    """Remove the temp files of uploads whose server died mid-way."""
    return leftovers.sweep_files(home / "tmp", TEMP_PATTERN)


def _disk_error(exc: OSError) -> StorageUnavailable:
    # A full or failing disk: say so, never the path.
    return unavailable("could not receive the upload", exc)


async def _chunks(request: Request, idle: float) -> AsyncIterator[bytes]:
    """The body's chunks; a 408 once none has come for ``idle`` seconds (the
    temp file goes with the request, and uvicorn closes the connection)."""
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), idle)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ApiError(
                408, f"the upload stalled: nothing came for {idle:g} s", headers=_CLOSE
            ) from None
        yield chunk


async def _receive_raw(
    chunks: AsyncIterator[bytes], out: BinaryIO, upload: Upload, limit: int
) -> int:
    """The body to ``out``; the bytes received."""
    async for chunk in chunks:
        upload.size += len(chunk)
        if upload.size > limit:
            raise _too_large(limit)
        if chunk:
            await run_in_threadpool(out.write, chunk)
    return upload.size


async def _receive_form(
    request: Request,
    chunks: AsyncIterator[bytes],
    out: BinaryIO,
    upload: Upload,
    limit: int,
    text_fields: frozenset[str],
) -> int:
    """The form's file part to ``out``, its fields to ``upload``; the bytes received."""
    # python-multipart's streaming parser rather than ``request.form()``: the
    # file part goes straight to our temp file, counted as it arrives, so the
    # cap holds mid-stream and nothing is spooled to a second file first.
    if len(request.headers.getlist("content-type")) > 1:  # which one counts: the reader's guess
        raise InvalidRequest("the request gives its Content-Type twice")
    _unrepeated(request.headers["content-type"].encode("latin-1"), "the Content-Type")
    _, options = parse_options_header(request.headers["content-type"])
    boundary = options.get(b"boundary", b"")
    if not 0 < len(boundary) <= 200:
        raise InvalidRequest("a multipart body needs a boundary")
    form = _Form(upload, limit, text_fields)
    parser = MultipartParser(boundary, form.callbacks())
    preamble = _Preamble(boundary)
    received = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > limit + FORM_OVERHEAD:
                raise _too_large(limit)
            parser.write(preamble.dropped(chunk))
            if form.pending:  # the file bytes of this chunk, written off the event loop
                data = b"".join(form.pending)
                form.pending.clear()
                await run_in_threadpool(out.write, data)
        parser.finalize()
    except FormParserError as exc:
        if "header size exceeded" in str(exc):  # the parser's own cap on a part's headers
            # A file name of 4,000-odd characters: "malformed" sent the
            # client looking for a bug in its encoder.
            raise InvalidRequest(
                "a multipart part's headers are too long (a file name of thousands of characters?)"
            ) from None
        raise InvalidRequest("the multipart body is malformed") from None
    if not form.ended:
        raise InvalidRequest("the multipart body is incomplete")
    if not form.has_file:
        raise InvalidRequest("a multipart upload needs a 'file' part")
    return received


class _Preamble:
    """Drops what a form sends before its first boundary (RFC 2046 §5.1.1: a
    preamble is to be ignored), which the parser took for a malformed body.
    The boundary starts the body, or a line (CRLF before it), wherever the
    chunks happen to split: a "--boundary" inside a line is no delimiter."""

    def __init__(self, boundary: bytes) -> None:
        self.first = b"--" + boundary
        self.delimiter = b"\r\n" + self.first
        self.held = b""
        self.at_start = True  # nothing dropped yet: the body may begin with it
        self.done = False

    def dropped(self, chunk: bytes) -> bytes:
        if self.done:
            return chunk
        data = self.held + chunk
        if self.at_start:
            if data.startswith(self.first):
                self.done = True
                return data
            if self.first.startswith(data):  # the boundary's start, so far
                self.held = data
                return b""
            self.at_start = False
        at = data.find(self.delimiter)
        if at < 0:  # its last bytes may start a delimiter the next chunk ends
            self.held = data[-(len(self.delimiter) - 1) :]
            return b""
        self.done = True
        return data[at:]


# A parameter of a header value: its name, then a quoted string (whose
# "; name=" is no parameter) or a token.
_PARAMETER = re.compile(rb';\s*([^\s=;"]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


def _unrepeated(value: bytes, what: str) -> None:
    """Refuses a header value that gives a parameter twice (``boundary=``,
    ``name=``, ``filename=``): the parser kept the last, a proxy in front may
    read the first, so a field checked as one was stored as another.  An
    RFC 2231 form (``filename*=``, ``filename*0=``) is the same parameter."""
    names = [m.group(1).lower().split(b"*")[0] for m in _PARAMETER.finditer(value)]
    if len(names) != len(set(names)):
        raise InvalidRequest(f"{what} gives one of its parameters twice")


def _filename(disposition: bytes, options: dict[bytes, bytes]) -> str:
    """The part's file name: ``filename``, or RFC 5987's ``filename*``
    (``UTF-8''%E2%82%AC.txt``), which some clients send alone (the parser
    drops it: the name was empty)."""
    params = {m.group(1).lower(): m.group(2) for m in _PARAMETER.finditer(disposition)}
    extended = params.get(b"filename*")
    if extended is None:
        raw, charset = options.get(b"filename", b""), "utf-8"
    else:
        declared, _, rest = extended.strip().strip(b'"').partition(b"'")
        raw = unquote_to_bytes(rest.partition(b"'")[2])
        charset = declared.decode("ascii", "replace") or "utf-8"
    # Refused, as ``?filename=%FF`` is: U+FFFD in place of each bad byte
    # stored a name the client never sent.  RFC 5987's two charsets (and
    # the Windows one browsers send for Latin-1): not every Python codec
    # (punycode raised a bare UnicodeError, a 500; utf-7 and unicode_escape
    # made names of their own).
    try:
        known = codecs.lookup(charset).name in _CHARSETS
    except LookupError:
        known = False
    if not known:
        raise InvalidRequest(
            "the file part's filename* names a charset other than UTF-8 or ISO-8859-1"
        )
    try:
        return raw.decode(charset)
    except UnicodeError:
        said = "UTF-8" if extended is None else "in the charset its filename* names"
        raise InvalidRequest(f"the file part's filename is not {said}") from None


_CHARSETS = frozenset({"utf-8", "iso8859-1", "cp1252", "ascii"})


class _Form:
    """python-multipart callbacks: the ``file`` part to ``pending``, text fields to memory."""

    def __init__(self, upload: Upload, limit: int, text_fields: frozenset[str]) -> None:
        self.upload = upload
        self.limit = limit
        self.text_fields = text_fields
        self.pending: list[bytes] = []
        self.has_file = False
        self.ended = False
        self._headers: dict[bytes, bytes] = {}
        self._name = b""
        self._value = b""
        self._part: str | None = None  # "file", or the name of a text field
        self._text = bytearray()

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._data,
            "on_part_end": self._end,
            "on_end": self._form_end,
        }

    def _begin(self) -> None:
        self._headers, self._part, self._text = {}, None, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        name = self._name.lower()
        if name in self._headers:  # which one counts is the reader's guess (a proxy's may differ)
            raise InvalidRequest("a multipart part repeats one of its headers")
        self._headers[name] = self._value
        self._name, self._value = b"", b""

    def _headers_finished(self) -> None:
        disposition = self._headers.get(b"content-disposition", b"")
        _unrepeated(disposition, "a multipart part's Content-Disposition")
        _, options = parse_options_header(disposition)
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == "file" and not self.has_file:
            self.has_file, self._part = True, "file"
            self.upload.filename = _filename(disposition, options)
        elif name in self.text_fields and name not in self.upload.fields:
            self._part = name
        else:
            # The name is not echoed: it is whatever the client sent.
            allowed = ", ".join(["file", *sorted(self.text_fields)])
            raise InvalidRequest(f"unexpected or repeated form field; expected {allowed}")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._part == "file":
            self.upload.size += end - start
            if self.upload.size > self.limit:
                raise _too_large(self.limit)
            self.pending.append(data[start:end])
        else:
            self._text += data[start:end]
            if len(self._text) > MAX_FIELD_BYTES:
                raise InvalidRequest(f"a form field has at most {MAX_FIELD_BYTES} bytes")

    def _end(self) -> None:
        if self._part is not None and self._part != "file":
            try:
                self.upload.fields[self._part] = self._text.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest("form fields must be UTF-8 text") from None

    def _form_end(self) -> None:
        self.ended = True


# -- routes ------------------------------------------------------------------------


@router.post(
    "",
    status_code=201,
    summary="Upload an object (raw body, or multipart with a `file` part)",
    description=(
        "Send the bytes as the body (any content type but multipart; name them with "
        "`?filename=`), or as the `file` part of a `multipart/form-data` form, which "
        "needs a Content-Length. Larger than the server's upload limit: 413. An "
        "empty body stores an empty object."
    ),
    openapi_extra=upload_body(),  # the body is read by receive_upload, not by FastAPI
)
async def upload_object(
    request: Request,
    filename: str | None = Query(None, max_length=4096, description="for a raw body (cut to 255)"),
    principal: Principal = scoped("objects:write"),
) -> Row:
    svc = services(request)
    ticket = Ticket()
    async with receive_upload(request, svc.settings) as upload:
        try:
            row = await run_in_threadpool(
                svc.storage.put_file,
                upload.path,
                # Never the temp file's own name: "" when the client gave none.
                filename=upload.filename or filename or "",
                project_id=principal.project_id,
                ticket=ticket,
            )
        except asyncio.CancelledError:
            # The server's stop cut the request short while the bytes were
            # copied into the pool: its client is told "not kept, send again"
            # (app.py), and so nothing is kept.  The copy ran on and the
            # object ended ready (sent again: a duplicate), or the process
            # left with it pending and its bytes in the pool for hours.
            # Called off here, not awaited: a cancelled task may await nothing.
            svc.storage.call_off(ticket)
            raise
    return public_object(row)


@router.get("", summary="List the project's objects, newest first")
def list_objects(
    request: Request,
    state: str | None = Query(None, max_length=10, description=", ".join(OBJECT_STATES)),
    limit: Annotated[Whole, Query(ge=1, le=500)] = 50,
    cursor: str | None = Query(None, max_length=40),
    principal: Principal = scoped("objects:read"),
) -> Row:
    rows = services(request).storage.list(
        project_id=principal.project_id,
        state=state,
        before_id=decode_cursor(cursor, "object_id") if cursor else None,
        limit=limit + 1,
    )
    return page(rows, limit, "object_id", public_object)


@router.get("/{object_id}", summary="An object's metadata")
def show_object(
    object_id: Id, request: Request, principal: Principal = scoped("objects:read")
) -> Row:
    return public_object(owned_object(services(request), object_id, principal))


@router.get(
    "/{object_id}/url",
    summary="A download URL that expires",
    description="Presigned by S3 for S3 pools; signed by this service (`/content`) otherwise.",
)
def object_url(
    object_id: Id, request: Request, principal: Principal = scoped("objects:read")
) -> Row:
    svc = services(request)
    owned_object(svc, object_id, principal)
    # Read the clock first: the URL expires no earlier than what we announce.
    expires_at = svc.storage.epoch() + svc.settings.signed_url_seconds
    base = link_base(request)
    url = svc.storage.signed_url(object_id, base)
    ours = parse_qs(urlsplit(url).query).get("expires", [""])[0]
    if url.startswith(base + "/") and ascii_int(ours) is not None:
        expires_at = int(ours)
    return {"url": url, "expires_at": datetime.fromtimestamp(expires_at, UTC)}


@router.get(
    "/{object_id}/content",
    summary="Download through a signed URL (no token: the signature is the capability)",
    description=(
        "A bad, expired or forged signature answers 403, all three alike. The bytes are "
        "checked against the object's checksum as they stream; on a mismatch the body "
        "ends short of its Content-Length. One byte range (Range: bytes=A-B) is a 206 "
        "with just that part; one starting past the end is a 416. `If-None-Match` "
        "naming the ETag is a 304 without a body; `If-Match` naming another is a 412."
    ),
    response_class=StreamingResponse,
    responses={
        200: {"description": "The object's bytes", "content": {"application/octet-stream": {}}},
        206: {
            "description": "One byte range of them (`Range: bytes=A-B`), with `Content-Range`",
            "content": {"application/octet-stream": {}},
        },
        304: {"description": "Not modified: `If-None-Match` names this object's ETag"},
    },
)
async def object_content(
    object_id: Id,
    request: Request,
    expires: str = Query(""),
    sig: str = Query(""),
) -> Response:
    st = services(request).storage
    at = ascii_int(expires, 12) or 0
    if len(sig) > 128 or not await run_in_threadpool(st.check_signature, object_id, at, sig):
        raise Forbidden("invalid or expired link")
    stack = contextlib.ExitStack()
    head = is_head(request)  # the headers only: the blob is not read
    try:
        row, part, src, first = await run_in_threadpool(
            _start, st, object_id, stack, request.headers, not head
        )
    except StorageUnavailable:
        stack.close()
        raise
    except ChecksumMismatch as exc:
        # A small blob is read whole before the headers go: its corruption is
        # known before anything is sent, and is the operator's to hear of.
        stack.close()
        log.error("object %s: download refused (%s)", object_id, exc)
        said = UNCHECKABLE if isinstance(exc, ChecksumMissing) else CORRUPT
        raise ApiError(500, said, code="object_corrupt") from None
    except _Precondition as exc:
        stack.close()
        if exc.status == 412:
            raise ApiError(412, "the object is not the version If-Match names") from None
        # Not modified: what the cache holds is these bytes (RFC 9110 §15.4.5).
        return Response(status_code=304, headers={"ETag": exc.tag, **_NOT_CACHED})
    except _Unsatisfiable as exc:
        stack.close()
        headers = {"Content-Range": f"bytes */{exc.size}"}
        raise ApiError(416, "the range starts past the object's end", headers=headers) from None
    except BlobMissing as exc:
        # A ready row without its blob is lost data, not a stale link: said
        # as a damaged blob is, and logged for the operator.  One that GC
        # collected meanwhile is gone as any other.
        stack.close()
        if not await run_in_threadpool(_still_ready, st, object_id):
            raise NotFound("object not available") from None
        log.error("object %s: download refused (its blob is missing: %s)", object_id, exc)
        raise ApiError(500, MISSING, code="object_corrupt") from None
    except HypermediaError:
        # Gone since the link was made, not ready: one answer.
        stack.close()
        raise NotFound("object not available") from None
    status, headers = _download_headers(row, part)
    media_type = str(row["mime_type"] or "application/octet-stream")
    if head:
        stack.close()
        return Response(status_code=status, media_type=media_type, headers=headers)
    return _Download(
        _held_back(stack, src, first, object_id),
        status_code=status,
        media_type=media_type,
        headers=headers,
        idle=st.settings.download_idle_seconds,
        object_id=object_id,
    )


CORRUPT = "the object's stored bytes do not match its checksum; quote the request id"
UNCHECKABLE = (
    "the object has no checksum to verify its bytes against (a row written without one); "
    "quote the request id"
)
MISSING = "the object's stored bytes are missing; quote the request id"


def _still_ready(st: Storage, object_id: int) -> bool:
    try:
        return bool(st.get(object_id)["state"] == "ready")
    except HypermediaError:
        return False


def _joined(headers: Headers, name: str) -> str | None:
    """A list header sent on several lines, as one (RFC 9110 §5.3)."""
    lines = headers.getlist(name)
    return ", ".join(lines) if lines else None


class _Precondition(HypermediaError):
    """If-Match or If-None-Match answered: 412, or 304."""

    def __init__(self, status: int, tag: str) -> None:
        super().__init__("precondition")
        self.status = status
        self.tag = tag


class _Unsatisfiable(HypermediaError):
    def __init__(self, size: int) -> None:
        super().__init__("range not satisfiable")
        self.size = size


def _start(
    st: Storage, object_id: int, stack: contextlib.ExitStack, asked: Headers, read: bool
) -> tuple[Row, tuple[int, int] | None, BinaryIO, bytes]:
    """What must work before the headers go: the row, the part asked for
    (None: all of it), the open blob and its first chunk.

    The whole body, a range that covers all of it included, is checked
    against the checksum as it streams; a part can only be checked for size."""
    row = st.get(object_id)
    if row["state"] != "ready":
        raise InvalidRequest(f"object {object_id} is {row['state']}, not ready")
    size = int(row["size"])
    tag = etag(row["checksum"])
    status = precondition(_joined(asked, "if-match"), _joined(asked, "if-none-match"), tag)
    if status is not None:
        raise _Precondition(status, tag)
    try:
        part = byte_range(asked.get("range"), size, asked.get("if-range"), tag)
    except RangeNotSatisfiable:
        raise _Unsatisfiable(size) from None
    # Opened for HEAD too (a blob gone missing answers as a GET would), read for GET.
    if part is None or part == (0, size):
        src = stack.enter_context(st.open_row(row))
    else:
        src = stack.enter_context(st.open_part(row, *part))
    first = src.read(CHUNK) if read else b""
    if read and len(first) < min(size - (part[0] if part else 0), CHUNK):
        # Short of what the ledger says, before the headers go: the next read
        # ends the blob, and the whole body's check runs now (a small blob cut
        # short answered 200 with nothing after the headers).
        first += src.read(CHUNK)
    return row, part, src, first


_NOT_CACHED = {"Cache-Control": "private, no-store"}


def _download_headers(row: Row, part: tuple[int, int] | None) -> tuple[int, dict[str, str]]:
    # Always an attachment, never sniffed: these bytes are served from the
    # API's own origin, where the dashboard's cookie lives.
    size = int(row["size"])
    headers = {
        "Content-Length": str(size),
        "Accept-Ranges": "bytes",
        "ETag": etag(row["checksum"]),
        "Content-Disposition": attachment(row["filename"]),
        "X-Content-Type-Options": "nosniff",
        **_NOT_CACHED,
    }
    if part is None:
        return 200, headers
    start, length = part
    headers["Content-Length"] = str(length)
    headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{size}"
    return 206, headers


class DownloadCutShort(Exception):
    """Raised mid-stream so the server drops the connection: the only signal left."""


class _Download(StreamingResponse):
    """A download that ends early, and quietly, when it must.

    A client that takes nothing for ``idle`` seconds is dropped: each one that
    stalled held an open blob and a few MB of buffers for as long as it liked.
    A body cut short (DownloadCutShort, said in the log already) ends with
    the connection, without the server's traceback of an application error.
    Either way the app returns before the body is complete, so the server
    closes the connection: the client sees less than Content-Length."""

    def __init__(self, *args: Any, idle: float, object_id: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.idle = idle
        self.object_id = object_id

    async def stream_response(self, send: Send) -> None:
        body = self.body_iterator
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        try:
            async for chunk in body:
                message = {"type": "http.response.body", "body": chunk, "more_body": True}
                try:
                    await asyncio.wait_for(send(message), self.idle)
                except TimeoutError:
                    why = f"the client took nothing for {self.idle:g} s"
                    log.warning("object %s: download dropped (%s)", self.object_id, why)
                    return
        except DownloadCutShort:
            return
        finally:
            await body.aclose()  # type: ignore[attr-defined]  # the blob is closed now
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _held_back(
    stack: contextlib.ExitStack, src: BinaryIO, chunk: bytes, object_id: int
) -> AsyncIterator[bytes]:
    """The blob's chunks, each sent only once the next has been read.

    The checksum is known after the last read: holding one chunk back means
    a mismatch leaves the body short of its Content-Length, never complete.
    """
    try:
        while chunk:
            following = await run_in_threadpool(src.read, CHUNK)
            yield chunk
            chunk = following
    except HypermediaError as exc:
        log.error("object %s: download cut short (%s)", object_id, exc)
        raise DownloadCutShort(f"object {object_id}") from None
    finally:
        await run_in_threadpool(stack.close)
