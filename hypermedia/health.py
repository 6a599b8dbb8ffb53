"""The embedded service's small HTTP surface: /healthz, /readyz and signed downloads.

The full HTTP API (FastAPI) joins later; until then ``serve --port`` gives
process supervisors something honest to probe, and serves the HMAC-signed
download URLs of objects in local pools (``hypermedia objects url``).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlsplit

from hypermedia.db.driver import Driver
from hypermedia.errors import HypermediaError
from hypermedia.storage.ledger import Storage

_CONTENT = re.compile(r"^/v1/objects/(\d{1,18})/content$")


def start(host: str, port: int, db: Driver, storage: Storage | None = None) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            match = _CONTENT.match(url.path)
            if url.path == "/healthz":
                self._send(200, {"status": "ok"})
            elif url.path == "/readyz":
                ok = db.healthy()
                self._send(200 if ok else 503, {"database": "ok" if ok else "unreachable"})
            elif match and storage is not None:
                self._download(storage, int(match.group(1)), parse_qs(url.query))
            else:
                self._send(404, {"code": "not_found", "message": "no such endpoint"})

        def _download(self, st: Storage, object_id: int, query: dict[str, list[str]]) -> None:
            try:
                expires = int(query.get("expires", ["0"])[0])
                sig = query.get("sig", [""])[0]
            except ValueError:
                expires, sig = 0, ""
            # One answer for a bad, expired or forged link: nothing to probe.
            if not st.check_signature(object_id, expires, sig):
                self._send(403, {"code": "forbidden", "message": "invalid or expired link"})
                return
            started = False
            try:
                row = st.get(object_id)
                with st.open(object_id) as src:
                    chunk = src.read(1024 * 1024)
                    started = True
                    self._headers(row)
                    # One chunk held back: the checksum is known at the end,
                    # and a mismatch must leave the body short, not complete.
                    while chunk:
                        following = src.read(1024 * 1024)
                        self.wfile.write(chunk)
                        chunk = following
            except HypermediaError:
                if not started:
                    self._send(404, {"code": "not_found", "message": "object not available"})
                # After the headers (a checksum mismatch found at the end, say)
                # the only honest signal left is a cut connection: the client
                # gets fewer bytes than Content-Length said.
                self.close_connection = True

        def _headers(self, row: dict[str, object]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", str(row["mime_type"] or "application/octet-stream"))
            self.send_header("Content-Length", str(row["size"]))
            if row["filename"]:
                name = quote(str(row["filename"]))
                self.send_header("Content-Disposition", f"attachment; filename*=UTF-8''{name}")
            self.end_headers()

        def _send(self, code: int, body: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
