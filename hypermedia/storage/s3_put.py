"""A single ``PutObject`` without botocore's per-call machinery.

Storing a batch of small files, the worker's CPU, not the network, was the
limit: botocore spends about 0.85 ms of Python on each ``PutObject`` (event
hooks, endpoint rules, parameter validation, response parsing), for a request
whose bytes the socket sends in a fraction of that.  Here the request is
built by hand (path-style URL, Content-MD5, the checksum metadata), signed by
botocore's own SigV4 signer with the client's credentials, and sent on a
urllib3 pool of our own: about half the CPU per object.

Everything else keeps going through the boto3 client; so does this request
whenever it cannot be sent the lean way (proxies configured in the
environment, no credentials found): ``LeanPut.of`` returns None then.
Failures look exactly like the client's: a non-2xx answer becomes a
botocore ``ClientError`` built from the store's error document, transport
errors stay urllib3's, and ``S3Backend._errors`` maps both as for any call.
"""

from __future__ import annotations

import os
import random
import re
import time
import urllib.request
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


class LeanPut:
    """PutObject of bytes to ``bucket`` at ``endpoint_url`` (path style)."""

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        region: str,
        credentials: Any,
        pool_size: int,
        timeouts: tuple[float, float],
    ) -> None:
        self._base = f"{endpoint_url.rstrip('/')}/{quote(bucket, safe='')}/"
        self._region = region
        self._credentials = credentials
        https = endpoint_url.startswith("https")
        tls: dict[str, Any] = {}
        if https:  # the CA bundle botocore would use
            tls = {"cert_reqs": "CERT_REQUIRED", "ca_certs": _ca_bundle()}
        self._pool = urllib3.PoolManager(
            maxsize=pool_size,
            timeout=urllib3.Timeout(connect=timeouts[0], read=timeouts[1]),
            retries=False,  # ours below, on answers as well as on connections
            **tls,
        )

    @classmethod
    def of(
        cls, client: Any, credentials: Any, bucket: str, region: str, pool_size: int
    ) -> LeanPut | None:
        """The lean path beside this boto3 client (signing with ``credentials``,
        the client's), or None where only the client will do."""
        if credentials is None or any(
            k in ("http", "https", "all") for k in urllib.request.getproxies()
        ):
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
        url = self._base + quote(key, safe="/~")
        for attempt in range(ATTEMPTS):
            request = AWSRequest("PUT", url, headers={**headers}, data=body)
            frozen = self._credentials.get_frozen_credentials()
            S3SigV4Auth(frozen, "s3", self._region).add_auth(request)
            last = attempt == ATTEMPTS - 1
            try:
                answer = self.send(url, dict(request.headers.items()), body)
            except (urllib3.exceptions.HTTPError, OSError):
                if last:
                    raise
                _backoff(attempt)
                continue
            if 200 <= answer.status < 300:
                return
            error = _client_error(answer.status, answer.data)
            code = error.response["Error"]["Code"]
            if last or not (answer.status in _RETRY_STATUS or code in _RETRY_CODES):
                raise error
            _backoff(attempt)

    def send(self, url: str, headers: dict[str, str], body: bytes) -> Any:
        """One HTTP request; a seam where tests corrupt bytes in flight."""
        return self._pool.request("PUT", url, body=body, headers=headers, redirect=False)


def _backoff(attempt: int) -> None:
    # botocore's standard mode: a random wait up to 2**attempt seconds (capped).
    time.sleep(random.uniform(0, min(20.0, 2.0**attempt)))


def _client_error(status: int, data: bytes) -> botocore.exceptions.ClientError:
    """The ClientError botocore would raise for this answer."""
    code = _CODE.search(data or b"")
    message = _MESSAGE.search(data or b"")
    error = {
        "Code": code.group(1).decode("utf-8", "replace") if code else str(status),
        "Message": message.group(1).decode("utf-8", "replace") if message else "",
    }
    response: Any = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "PutObject")


def _ca_bundle() -> str:
    return os.environ.get("AWS_CA_BUNDLE") or str(get_cert_path(True))
