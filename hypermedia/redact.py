"""One function decides what text may leave the system.

Anything shown to a user (job reasons, events, CLI output) passes through
``redact``: file paths, URLs with credentials, tokens and stack traces are
replaced, and the text is bounded.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote_plus

_PATTERNS = [
    # Traceback blocks: keep nothing after the header.
    (re.compile(r"Traceback \(most recent call last\):.*", re.S), "[traceback removed]"),
    # Credentials inside URLs: scheme://user:pass@host (the user may be empty)
    (re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s:@]*:[^/\s@]+@", re.I), r"\1[redacted]@"),
    # Bearer tokens, API keys, secrets given as key=value.
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [redacted]"),
    # Not MySQL's "(using password: YES)", a flag: eating it to the next space
    # cut the message short with its brackets open.
    (
        re.compile(
            r"(?i)\b(password|passwd|secret|token|api[_-]?key|access[_-]?key)\b"
            r"(?!: (?:YES|NO)\)(?!\w))\s*[=:]\s*\S+"
        ),
        r"\1=[redacted]",
    ),
    # API tokens (hm_<10 public>_<32 url-safe secret>) and dashboard session
    # secrets (hms_<43>), whole: "\bhm_[A-Za-z0-9]{8,}\b" never matched a
    # real token (the "_" after its public part is a word character).
    (re.compile(r"(?<![A-Za-z0-9])hms?_[A-Za-z0-9_-]{8,}"), "[token]"),  # as _TOKEN
    # An AWS SigV4 Authorization header quoted in an error: its key id and
    # signature ("Credential=AKIA…/20261204/…, Signature=ab12…").
    (re.compile(r"(?i)\b(credential|signature)=[^\s,'\"]+"), r"\1=[redacted]"),
    # Absolute filesystem paths (POSIX) and Windows drive paths.
    (re.compile(r"(?<![\w/])(?:/[\w.@+-]+){2,}/?"), "[path]"),
    (re.compile(r"\b[A-Za-z]:\\[^\s]+"), "[path]"),
    # Control characters: PostgreSQL stores no NUL in text, and the others
    # only garble a terminal (a hostile file's name or tag can carry them).
    (re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"), "\ufffd"),
]

MAX_REASON = 300


def redact(text: object, limit: int = MAX_REASON) -> str:
    return _redact(str(text), limit)


# Most messages repeat ("attempt completed", "debug.noop queued with …"):
# remembering recent answers keeps bulk enqueues and settles cheap.
@functools.lru_cache(maxsize=4096)
def _redact(text: str, limit: int) -> str:
    out = text
    for pattern, repl in _PATTERNS:
        out = pattern.sub(repl, out)
    out = " ".join(out.split())
    if len(out) > limit:
        out = out[: limit - 1] + "…"
    return out


def brief(exc: BaseException) -> str:
    """An exception for a log line: its kind and the first line of what the
    database or the system said ("OperationalError: database or disk is
    full"), redacted; never the statement or its parameters."""
    cause = getattr(exc, "orig", None) or exc  # SQLAlchemy's DBAPIError wraps the driver's
    lines = str(cause).strip().splitlines()
    said = redact(lines[0], 160) if lines else ""
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


_TOKEN = re.compile(r"(?<![A-Za-z0-9])hms?_[A-Za-z0-9_-]{8,}")


# A signed download URL's signature: whoever reads the log could download
# with it until the URL expires.  Its name as the server reads it: "%73ig"
# and "s%69g" are "sig" too.
_PARAM = re.compile(r"(?<=[?&])([^=&#\s]+)=([^&#\s]+)")
# A run of URL text with %-escapes: "hm%5F…" is a token once decoded.
_ESCAPED = re.compile(r"[^?&=/#\s]*%[0-9A-Fa-f]{2}[^?&=/#\s]*")


def tokens(text: str) -> str:
    """``text`` with API tokens, session secrets and URL signatures replaced,
    and nothing else (an access log line keeps its path, escapes and all)."""
    text = _TOKEN.sub("[token]", _ESCAPED.sub(_escaped_token, text))
    return _PARAM.sub(_signature, text)


def _escaped_token(m: re.Match[str]) -> str:
    return "[token]" if _TOKEN.search(unquote_plus(m.group())) else m.group()


def _signature(m: re.Match[str]) -> str:
    name = m.group(1)
    return f"{name}=[sig]" if unquote_plus(name) == "sig" else m.group()
