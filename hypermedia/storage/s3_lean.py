"""Small S3 requests without botocore's per-call machinery.

Storing or fetching a batch of small files, the worker's CPU, not the network,
was the limit: botocore spends about 0.85 ms of Python on each ``PutObject``
or ``GetObject`` (event hooks, endpoint rules, parameter validation, response
parsing), for a request whose bytes the socket moves in a fraction of that.
Here the request is built by hand (path-style URL, the caller's headers),
signed by botocore's own SigV4 signer with the client's credentials, and sent
on a urllib3 pool of our own: about half the CPU per object.

Only the requests of small objects come here (``S3Backend._put_small`` and the
first, ranged GET of ``get_file``); everything else keeps going through the
boto3 client, and so do these whenever they cannot be sent the lean way: with
proxies configured in the environment ``LeanS3.of`` returns None, and a store
that answers with a redirect (a bucket in another region, which botocore
follows) makes ``S3Backend`` leave the lean path for good.  Failures look
exactly like the client's: a non-2xx answer becomes a botocore ``ClientError``
built from the store's error document, transport errors stay urllib3's, and
``S3Backend._errors`` maps both as for any call.
"""

from __future__ import annotations

import os
import random
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import botocore.exceptions
import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.httpsession import get_cert_path

# As the client is configured (s3._client_config): one retry, standard backoff.
ATTEMPTS = 2
_RETRY_STATUS = {500, 502, 503, 504}
_RETRY_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"}
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{0,500})</Message>")
_OPERATION = {"PUT": "PutObject", "GET": "GetObject"}


class LeanS3:
    """PutObject and GetObject on ``bucket`` at ``endpoint_url`` (path style)."""

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        region: str,
        credentials: Callable[[], Any],
        pool_size: int,
        timeouts: tuple[float, float],
    ) -> None:
        self._base = f"{endpoint_url.rstrip('/')}/{quote(bucket, safe='')}/"
        self._region = region
        # Resolved at the first request, as the client does: the default chain
        # may ask the instance metadata service, which takes time off EC2.
        self._resolve = credentials
        self._credentials: Any = None
        tls: dict[str, Any] = {}
        if endpoint_url.startswith("https"):  # the CA bundle botocore would use
            tls = {"cert_reqs": "CERT_REQUIRED", "ca_certs": _ca_bundle()}
        self._pool = urllib3.PoolManager(
            maxsize=pool_size,
            timeout=urllib3.Timeout(connect=timeouts[0], read=timeouts[1]),
            retries=False,  # ours below, on answers as well as on connections
            **tls,
        )

    @classmethod
    def of(
        cls, client: Any, credentials: Callable[[], Any], bucket: str, region: str, pool_size: int
    ) -> LeanS3 | None:
        """The lean path beside this boto3 client (signing with what
        ``credentials()`` returns: the client's), or None where only the client will do."""
        if any(k in ("http", "https", "all") for k in urllib.request.getproxies()):
            return None
        cfg = client.meta.config
        return cls(
            client.meta.endpoint_url,
            bucket,
            region,
            credentials,
            pool_size,
            (float(cfg.connect_timeout), float(cfg.read_timeout)),
        )

    def close(self) -> None:
        self._pool.clear()

    def put(self, key: str, body: bytes, headers: dict[str, str]) -> None:
        """PUT ``body`` under ``key`` with ``headers`` (Content-MD5, x-amz-meta-*)."""
        answer = self._request("PUT", key, headers, body)
        answer.drain_conn()  # whatever the store said beside the status: not ours to keep
        answer.release_conn()

    def get(self, key: str, headers: dict[str, str]) -> dict[str, Any]:
        """GET ``key`` (``headers``: a Range, say); the answer's fields as boto3
        names them, ``Body`` a stream to read and close."""
        answer = self._request("GET", key, headers, None)
        h = answer.headers
        return {
            "Body": _Body(answer),
            "ContentLength": int(h.get("Content-Length") or 0),
            "ContentRange": h.get("Content-Range", ""),
            "ETag": h.get("ETag", ""),
        }

    def _request(self, method: str, key: str, headers: dict[str, str], body: bytes | None) -> Any:
        url = self._base + quote(key, safe="/~")
        for attempt in range(ATTEMPTS):
            request = AWSRequest(method, url, headers={**headers}, data=body)
            S3SigV4Auth(self._frozen(), "s3", self._region).add_auth(request)
            last = attempt == ATTEMPTS - 1
            try:
                answer = self.send(method, url, dict(request.headers.items()), body)
            except (urllib3.exceptions.HTTPError, OSError):
                if last:
                    raise
                _backoff(attempt)
                continue
            if 200 <= answer.status < 300:
                return answer
            error = _client_error(method, answer.status, answer.read())
            answer.release_conn()
            code = error.response["Error"]["Code"]
            if last or not (answer.status in _RETRY_STATUS or code in _RETRY_CODES):
                raise error
            _backoff(attempt)
        raise AssertionError("unreachable")  # the last attempt returned or raised

    def _frozen(self) -> Any:
        if self._credentials is None:
            self._credentials = self._resolve()
            if self._credentials is None:
                raise botocore.exceptions.NoCredentialsError()
        return self._credentials.get_frozen_credentials()

    def send(self, method: str, url: str, headers: dict[str, str], body: bytes | None) -> Any:
        """One HTTP request, its body left to stream; a seam for tests."""
        return self._pool.request(
            method, url, body=body, headers=headers, redirect=False, preload_content=False
        )


class _Body:
    """A GET's body; closing it returns the connection to the pool once the
    body was read to its end (a half-read one is closed instead)."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def read(self, size: int | None = None) -> bytes:
        return bytes(self._answer.read(size))

    def close(self) -> None:
        if self._answer.length_remaining == 0:
            self._answer.release_conn()
        else:
            self._answer.close()


def _backoff(attempt: int) -> None:
    # botocore's standard mode: a random wait up to 2**attempt seconds (capped).
    time.sleep(random.uniform(0, min(20.0, 2.0**attempt)))


def _client_error(method: str, status: int, data: bytes) -> botocore.exceptions.ClientError:
    """The ClientError botocore would raise for this answer."""
    code = _CODE.search(data or b"")
    message = _MESSAGE.search(data or b"")
    error = {
        "Code": code.group(1).decode("utf-8", "replace") if code else str(status),
        "Message": message.group(1).decode("utf-8", "replace") if message else "",
    }
    response: Any = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, _OPERATION[method])


def _ca_bundle() -> str:
    return os.environ.get("AWS_CA_BUNDLE") or str(get_cert_path(True))
