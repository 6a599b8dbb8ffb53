"""security.virus_scan: ClamAV's verdict on an object, through clamd's INSTREAM.

The child streams the input (already in its scratch directory) to clamd over
the socket the profile names: ``clamd`` is ``unix:///path/to/clamd.ctl`` or
``tcp://host:port`` and only a profile sets it, never a job.  The protocol:
``zINSTREAM\\0``, then chunks each prefixed by its length (4 bytes, big
endian), then a zero length; clamd answers ``stream: OK``, ``stream: <name>
FOUND`` or ``<reason> ERROR`` and closes the connection.

Verdicts:

* ``clean``: clamd read every byte and found nothing;
* ``infected``: clamd named a signature (``signature``);
* ``not_fully_scanned``: something was not scanned, and the file is never
  called clean: it is larger than the profile's ``max_bytes`` (only the first
  ``max_bytes`` are sent; a signature found in them still makes it
  ``infected``), it exceeded clamd's ``StreamMaxLength`` ("INSTREAM size
  limit exceeded"), clamd answered ERROR, or clamd stopped at one of its own
  scan limits and said so with a ``Heuristics.Limits.Exceeded.*`` name
  (``AlertExceedsMax yes`` in clamd.conf; without it clamd calls such files OK,
  see docs/pipelines.md), or clamd said OK for a ZIP with a member larger than
  ``clamd_max_file_size`` (clamd's MaxFileSize: its ZIP reader scans only
  that much of a member and says OK even with AlertExceedsMax), or for a
  ZIP with an encrypted member or members its central directory does not
  list (clamd reads neither) — ZIPs inside other ZIPs, tars and gzip, bzip2
  or xz streams included —, or a compressed stream that unpacks past
  MaxFileSize, or clamd named a ``Heuristics.Encrypted.*``
  (``AlertEncryptedArchive``/``AlertEncryptedDoc``: unread, not a virus).
  ``reason`` says which.

clamd not answering (no socket, connection refused, a timeout, a connection
closed without an answer) is PROVIDER_UNAVAILABLE, which is retried.  The
result is ``{"verdict", "signature", "engine", "reason", "bytes_sent"}``
(``engine`` is clamd's VERSION answer, which names its database version) and
the verdict is also recorded as a data output ``virus_verdict``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from hypermedia.errors import JobError
from hypermedia.pipelines import nested, zipsizes
from hypermedia.pipelines import schema as S
from hypermedia.pipelines.registry import Context, Pipeline, register
from hypermedia.redact import redact

DEFAULT_CLAMD = "unix:///run/clamav/clamd.ctl"
CONNECT_TIMEOUT = 5.0
PING_TIMEOUT = 1.0
CHUNK = 256 * 1024
MAX_REPLY = 64 * 1024
LIMIT_HEURISTIC = "Heuristics.Limits.Exceeded"
STREAM_LIMIT = (
    "INSTREAM size limit exceeded (the file is over clamd's StreamMaxLength: "
    "clamd scanned none of it)"
)
ENCRYPTED_HEURISTIC = "Heuristics.Encrypted."
# Without libclamunrar clamd reads a RAR's bytes as they are: its members are
# never unpacked, so no hash signature (most of a signature database) can
# match one, and a stored EICAR in a RAR was OK, called clean.
RAR_UNOPENED = (
    "a RAR archive is in it: clamd unpacks RAR only with libclamunrar "
    "(the profile does not say clamd_unpacks_rar), so its members were not scanned"
)
UNIX_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes, the last one a NUL

SCHEMA: S.Schema = {
    "clamd": S.Field(
        str,
        DEFAULT_CLAMD,
        overridable=False,
        private=True,
        doc="clamd's socket: unix:///path or tcp://host:port",
    ),
    "max_bytes": S.Field(
        int,
        100 * 1024 * 1024,
        1,
        4 * 1024**3,
        overridable=False,
        doc="larger files are scanned up to this size and reported not_fully_scanned",
    ),
    "timeout_seconds": S.Field(
        int,
        120,
        1,
        3600,
        overridable=False,
        doc="how long clamd may take to answer once connected",
    ),
    "clamd_max_file_size": S.Field(
        int,
        25 * 1024 * 1024,
        1,
        4 * 1024**3,
        overridable=False,
        doc="clamd.conf's MaxFileSize: a ZIP member larger than this is not_fully_scanned",
    ),
    "clamd_unpacks_rar": S.Field(
        bool,
        False,
        overridable=False,
        doc="clamd has libclamunrar (non-free, not in Debian main): without it a RAR's "
        "members are not unpacked, and a RAR is not_fully_scanned",
    ),
}

Address = tuple[str, Any]  # ("unix", path) or ("tcp", (host, port))


def parse_address(url: str) -> Address:
    """``unix:///abs/path`` or ``tcp://host:port``; anything else is INVALID_PARAMS."""
    bad = JobError("INVALID_PARAMS", "clamd must be unix:///path or tcp://host:port")
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        raise bad from None
    if u.query or u.fragment:
        raise bad
    if u.scheme == "unix" and not u.netloc and u.path.startswith("/") and len(u.path) > 1:
        if len(os.fsencode(u.path)) > UNIX_PATH_MAX:
            # connect() could never reach it: a profile error, not clamd being away.
            raise JobError(
                "INVALID_PARAMS", f"clamd's unix socket path is over {UNIX_PATH_MAX} bytes"
            )
        return ("unix", u.path)
    if u.username is not None or u.password is not None:
        # clamd has no login: credentials in its URL were ignored, and shown.
        raise JobError("INVALID_PARAMS", "clamd's URL takes no user or password")
    if u.scheme == "tcp" and u.hostname and port and u.path in ("", "/"):
        return ("tcp", (u.hostname, port))
    raise bad


def _check(values: dict[str, Any]) -> None:
    parse_address(values["clamd"])


# -- talking to clamd ------------------------------------------------------------------


def _unavailable(what: str, exc: BaseException | None = None) -> JobError:
    if isinstance(exc, TimeoutError):
        why = "timed out"
    elif isinstance(exc, socket.gaierror):
        why = "host name not resolved"
    elif isinstance(exc, ConnectionRefusedError):
        why = "connection refused"
    elif isinstance(exc, FileNotFoundError):
        why = "no socket"
    elif isinstance(exc, ConnectionError):
        why = "connection lost"
    elif isinstance(exc, OSError) and exc.errno:
        why = os.strerror(exc.errno).lower()
    else:
        why = ""
    return JobError("PROVIDER_UNAVAILABLE", f"clamd {what}" + (f" ({why})" if why else ""))


def _connect(address: Address, timeout: float, connect_timeout: float) -> socket.socket:
    kind, where = address
    sock: socket.socket | None = None
    try:
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(connect_timeout)
            sock.connect(where)
        else:
            sock = socket.create_connection(where, timeout=connect_timeout)
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise _unavailable("is not reachable", exc) from None
    sock.settimeout(timeout)
    return sock


def _read_reply(sock: socket.socket, timeout: float) -> str:
    """Everything clamd says until it closes the connection (it does after one command).

    Within ``timeout`` seconds in all, not per read: a peer that trickles a
    byte at a time would otherwise hold the attempt until its job's timeout.
    A complete answer (clamd ends it with a NUL) is kept if the close is late.
    """
    parts: list[bytes] = []
    n = 0
    deadline = time.monotonic() + timeout
    try:
        while n < MAX_REPLY:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            data = sock.recv(4096)
            if not data:
                break
            parts.append(data)
            n += len(data)
    except TimeoutError as exc:
        if not (parts and parts[-1].endswith(b"\0")):
            raise _unavailable("did not answer", exc) from None
    except OSError as exc:
        if not parts:
            raise _unavailable("did not answer", exc) from None
    reply = b"".join(parts)
    if not reply.strip(b"\0\n "):
        raise _unavailable("closed the connection without an answer")
    return reply.decode("utf-8", "replace")


def command(address: Address, name: str, timeout: float = CONNECT_TIMEOUT) -> str:
    """A one-line command (PING, VERSION) and clamd's answer."""
    with _connect(address, timeout, min(timeout, CONNECT_TIMEOUT)) as sock:
        try:
            sock.sendall(b"z" + name.encode() + b"\0")
        except OSError as exc:
            raise _unavailable("is not reachable", exc) from None
        return _clean(_read_reply(sock, timeout).strip("\0\n "))


def _answered(sock: socket.socket) -> bool:
    """Whether clamd has already said something (it stops reading at a size limit)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def instream(
    address: Address,
    path: str,
    max_bytes: int,
    timeout: float,
    progress: Callable[[float], None] | None = None,
) -> tuple[str, int]:
    """Stream up to ``max_bytes`` of ``path`` to clamd; its answer and the bytes sent."""
    size = os.path.getsize(path)
    limit = min(size, max_bytes)
    sent = 0
    next_report = limit / 10
    # The file must be taken within ``timeout`` in all, as the answer must
    # come within it: a peer reading 200 kB/s held an attempt for as long as
    # its job's timeout (sendall's timeout bounds each call, and a call is a chunk).
    deadline = time.monotonic() + timeout
    with _connect(address, timeout, CONNECT_TIMEOUT) as sock, open(path, "rb") as f:
        try:
            sock.sendall(b"zINSTREAM\0")
            early = False
            while sent < limit:
                try:
                    chunk = f.read(min(CHUNK, limit - sent))
                except OSError:
                    raise JobError("CORRUPT_INPUT", "the input file could not be read") from None
                if not chunk:
                    break
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(struct.pack(">I", len(chunk)) + chunk)
                sent += len(chunk)
                if _answered(sock):
                    early = True  # over StreamMaxLength: the answer is waiting
                    break
                if progress is not None and sent >= next_report:
                    progress(sent / limit)
                    next_report += limit / 10
            if not early:
                sock.sendall(struct.pack(">I", 0))
        except (BrokenPipeError, ConnectionResetError):
            pass  # clamd stopped reading (a size limit): its answer may be waiting
        except OSError as exc:
            raise _unavailable("did not take the file", exc) from None
        return _read_reply(sock, timeout), sent


def verdict(reply: str, sent: int, size: int, max_bytes: int) -> tuple[str, str | None, str | None]:
    """(verdict, signature, reason) from clamd's INSTREAM answer to ``sent``
    bytes of a file of ``size``, of which the profile lets ``max_bytes`` be sent."""
    found: list[str] = []
    limits: list[str] = []
    errors: list[str] = []
    ok = False
    for raw in reply.replace("\0", "\n").splitlines():
        line = raw.strip()
        if line.startswith("stream:"):
            line = line[len("stream:") :].strip()
        if not line:
            continue
        if line.endswith(" FOUND"):
            name = _clean(line[: -len(" FOUND")].strip())
            unread = name.startswith((LIMIT_HEURISTIC, ENCRYPTED_HEURISTIC))
            (limits if unread else found).append(name)
        elif line == "OK":
            ok = True
        elif line.endswith("ERROR"):
            error = _clean(line[: -len("ERROR")].strip().rstrip(".:"))
            # clamd drops a stream over StreamMaxLength whole: none of it was scanned.
            errors.append(STREAM_LIMIT if error.startswith("INSTREAM size limit") else error)
        else:
            raise JobError("PROVIDER_UNAVAILABLE", "clamd gave an unexpected answer")
    if found:
        return "infected", found[0], None
    # Said only of the profile's cut: clamd may stop reading sooner (its own limit).
    cut = (
        f"larger than max_bytes: only its first {max_bytes} bytes were to be sent"
        if size > max_bytes
        else ""
    )
    if limits:
        if limits[0].startswith(ENCRYPTED_HEURISTIC):
            # AlertEncrypted*: an encrypted archive or document is unread, not a virus.
            why = f"clamd could not decrypt it ({limits[0]})"
        else:
            limit = limits[0][len(LIMIT_HEURISTIC) :].strip(".") or "a limit"
            why = f"clamd stopped at its scan limit ({limit})"
        # Both said: the reason named clamd's limit alone, and not the profile's cut.
        return "not_fully_scanned", None, f"{why}; {cut}" if cut else why
    if errors:
        why = f"clamd could not scan it all: {errors[0]}"
        return "not_fully_scanned", None, f"{why}; {cut}" if cut else why
    if not ok:
        raise JobError("PROVIDER_UNAVAILABLE", "clamd gave an unexpected answer")
    if cut:
        return "not_fully_scanned", None, cut
    if sent < size:
        # It answered OK before it had taken the whole file (no clamd does;
        # something else on its address may): what it did not read is unscanned.
        return "not_fully_scanned", None, f"clamd answered after {sent} of its {size} bytes"
    return "clean", None, None


def _clean(text: str, limit: int = 200) -> str:
    """Printable ASCII only, short, and redacted: clamd's words end up in
    results shown to people (its errors name paths on its host)."""
    return redact("".join(c for c in text if " " <= c <= "~"), limit)


# -- the pipeline ----------------------------------------------------------------------


def _run(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    if ctx.input_path is None:
        raise JobError("INVALID_PARAMS", "security.virus_scan needs an input object")
    address = parse_address(str(params.get("clamd", DEFAULT_CLAMD)))
    max_bytes = int(params.get("max_bytes", SCHEMA["max_bytes"].default))
    timeout = float(params.get("timeout_seconds", SCHEMA["timeout_seconds"].default))
    try:
        size = os.path.getsize(ctx.input_path)
    except OSError:
        raise JobError("CORRUPT_INPUT", "the input file could not be read") from None
    ctx.progress(2, "asking clamd")
    engine = command(address, "VERSION", timeout)  # a busy clamd answers late
    if not engine.startswith("ClamAV "):  # not clamd (a database's greeting): not sent the file
        raise JobError("PROVIDER_UNAVAILABLE", "what answers on clamd's address is not clamd")
    ctx.progress(5, "scanning")
    reply, sent = instream(
        address,
        ctx.input_path,
        max_bytes,
        timeout,
        lambda done: ctx.progress(5 + 90 * done, "scanning"),
    )
    result, signature, reason = verdict(reply, sent, size, max_bytes)
    if result == "clean":
        limit = int(params.get("clamd_max_file_size", SCHEMA["clamd_max_file_size"].default))

        def alone(path: str) -> tuple[str, str | None, str | None]:
            reply, member_sent = instream(address, path, max_bytes, timeout)
            return verdict(reply, member_sent, os.path.getsize(path), max_bytes)

        survey = nested.survey_nested(ctx.input_path, ctx.scratch, limit, alone)
        reason = _zip_reason(survey, limit)
        if reason is None and survey.rar and not params.get("clamd_unpacks_rar", False):
            reason = RAR_UNOPENED
        if survey.found:  # in a member clamd had not decoded inside the archive
            result, signature, reason = "infected", survey.found, None
        elif reason is not None:
            result = "not_fully_scanned"
    ctx.progress(100, result)
    ctx.output("virus_verdict", "application/json", {"verdict": result, "signature": signature})
    return {
        "verdict": result,
        "signature": signature,
        "engine": engine,
        "reason": reason,
        "bytes_sent": sent,
    }


def _zip_reason(zip_: zipsizes.Survey, limit: int) -> str | None:
    """Why clamd's OK for a ZIP is not clean: a member it read in part, or not at all."""
    if zip_.encrypted:
        return "a ZIP member is encrypted: clamd could not read it"
    if zip_.locked:
        return "a PDF in it needs a password to open: clamd could not read what is inside"
    if zip_.largest > limit:
        return (
            f"a ZIP member of {zip_.largest} bytes is over clamd's MaxFileSize ({limit}): "
            "clamd scanned only its first MaxFileSize bytes"
        )
    if zip_.overflowed:
        return (
            f"a compressed stream in it (gzip, bzip2, xz, or a PDF's) unpacks to more "
            f"than clamd's MaxFileSize ({limit}): clamd scanned only its first MaxFileSize bytes"
        )
    if zip_.largest == zipsizes.UNKNOWN or zip_.unsized:
        return (
            "a ZIP member's size is declared by neither its header nor a readable "
            "directory: clamd may have scanned only its first MaxFileSize bytes"
        )
    if zip_.hidden:
        return (
            "a ZIP member is not listed in a central directory clamd can read: "
            "clamd does not unpack such members"
        )
    if zip_.overlarge:
        return (
            f"an archive member of {zip_.overlarge} bytes is over clamd's MaxFileSize "
            f"({limit}): clamd skips or cuts such members"
        )
    if zip_.unscanned:
        return f"a member sent to clamd alone was not fully scanned: {zip_.unscanned}"
    if zip_.undecoded:
        return (
            "a ZIP member is compressed by a method clamd does not decode (LZMA, PPMd, "
            "XZ, Zstandard): clamd read its bytes as they are"
        )
    if zip_.joined:
        return (
            "a gzip, bzip2 or xz file in it holds more streams after its first: "
            "clamd unpacks only the first"
        )
    if zip_.unopened:
        return (
            f"it holds {zip_.unopened} data, which clamd does not unpack: "
            "what is inside was not scanned"
        )
    if zip_.unread:
        return (
            "an archive or stream in it could not be unpacked here (damaged, or a "
            "compression method not supported) to check that clamd read all of it"
        )
    if zip_.unchecked:
        return (
            "archives inside it are too many, too large or nested too deep to check "
            "that clamd read all of their members"
        )
    return None


def available() -> str | None:
    """Whether clamd answers PING on the default socket."""
    return available_with({})


def available_with(settings: Mapping[str, Any]) -> str | None:
    """Whether clamd answers PING on the socket a profile names (else the default)."""
    address = str(settings.get("clamd") or DEFAULT_CLAMD)
    try:
        answer = command(parse_address(address), "PING", PING_TIMEOUT)
    except JobError:
        answer = ""
    if answer != "PONG":  # (a profile stored before credentials were refused: redacted)
        return redact(f"clamd does not answer on {address}")
    return None


VIRUS_SCAN = register(
    Pipeline(
        "security.virus_scan",
        "bulk",
        S.validator(SCHEMA, _check),
        _run,
        schema=SCHEMA,
        available=available,
        available_with=available_with,
        default_profile="virus-scan",
        network=True,  # clamd, by Unix socket or TCP
        needs_input=True,
        doc="ClamAV verdict through clamd: clean, infected (+ signature) or not_fully_scanned",
    )
)
