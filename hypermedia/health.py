"""A minimal /healthz and /readyz endpoint for the embedded service.

The full HTTP API (FastAPI) replaces this; until then ``serve --port`` still
gives process supervisors something honest to probe.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hypermedia.db.driver import Driver


def start(host: str, port: int, db: Driver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, {"status": "ok"})
            elif self.path == "/readyz":
                ok = db.healthy()
                self._send(200 if ok else 503, {"database": "ok" if ok else "unreachable"})
            else:
                self._send(404, {"code": "not_found", "message": "no such endpoint"})

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
