"""ListObjectsV2 over the standard library: the one control-plane request of every sync and
resync, without botocore.

Why: a command and a scheduled resync are fresh processes, and in a fresh process botocore costs
~90 ms to import and ~90 ms to build an S3 client (it parses the S3 service model and its
endpoint rules from JSON), then ~25 ms to parse each 1,000-key page — while ``s5cmd sync``
finishes a whole resync of 2,000 files with 20 changed in 0.2–0.4 s on the benchmarks' 2-core
machine (``bench/README.md``, "The command against s5cmd"). Here the
same listing costs one signed GET per page and a C XML parser. Pages are yielded as they come,
so a listing of a million keys holds one page, not all of them.

Scope: this is a fast path for the ordinary case, not a second S3 client. It signs exactly one
kind of request (SigV4, ``list-type=2`` with ``encoding-type=url``, keys decoded as botocore
decodes them) and accepts only a 200 whose body parses completely. Anything else — an HTTP error,
a redirect, a refused connection, a malformed page — and any setting that changes how botocore
reaches S3 (a proxy for the endpoint, an AWS config file, FIPS or dual-stack endpoints, a non-default
partition) hands the listing to boto3 from that page on, which owns retries, region redirects and
the error messages that name the fix. A failure costs one extra request, never a different answer.
Nothing here logs or raises a credential.

TLS is verified against ``AWS_CA_BUNDLE`` when it is set, as botocore does, else against the
system's trust store (botocore uses certifi's copy of it).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import logging
import os
import ssl
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit

from ..credentials import S3Credentials

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
#: Settings under which botocore would not make the request we make: then boto3 lists.
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
_AWS_ENDPOINT_VARIABLES = ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT")
_TIMEOUT_S = 60

log = logging.getLogger(__name__)

#: One page as botocore returns it: ``Contents`` items with Key, Size, ETag and raw LastModified,
#: ``CommonPrefixes`` when there are any, and ``IsTruncated``.
Page = dict[str, Any]


#: Lists the rest of a prefix through boto3 from a continuation token (None: from the start).
Fallback = Callable[[str | None], Iterator[Page]]


def list_pages(credentials: S3Credentials, bucket: str, prefix: str, *, fallback: Fallback, page_size: int = 1000,
               delimiter: str | None = None, environ: Mapping[str, str] | None = None) -> Iterator[Page]:
    """The ListObjectsV2 pages of ``prefix`` in ``bucket`` as they come, one in memory at a time
    (with ``delimiter``, each page's ``CommonPrefixes`` too). Where this request cannot be made,
    and from the first page that fails, ``fallback`` lists the rest — from that page's
    continuation token, so no page is read twice or missed; it must list with the same
    ``delimiter``."""
    env = os.environ if environ is None else environ
    target = _target(credentials, bucket, env)
    if target is None:
        yield from fallback(None)
        return
    token: list[str | None] = [None]  # where the pages read so far end
    try:
        yield from _fetch(credentials, bucket, prefix, delimiter, page_size, target, env, token)
    except _NotPlain as exc:
        log.debug("signed listing stopped (%s); listing the rest through boto3", exc)
        yield from fallback(token[0])


class _NotPlain(Exception):
    """A page this request could not read as plainly as botocore would: boto3 lists from there."""


def _fetch(credentials: S3Credentials, bucket: str, prefix: str, delimiter: str | None, page_size: int,
           target: tuple[str, str, str], environ: Mapping[str, str], token: list[str | None]) -> Iterator[Page]:
    """The pages over one kept-alive connection; :class:`_NotPlain` on any answer but a 200 that
    parses whole, with ``token[0]`` the continuation token of the page that was not read."""
    scheme, host, path = target
    connection: http.client.HTTPConnection
    if scheme == "https":
        try:
            context = ssl.create_default_context(cafile=environ.get("AWS_CA_BUNDLE") or None)
        except (OSError, ssl.SSLError) as exc:  # an unreadable bundle: boto3 reports it, naming the fix
            raise _NotPlain(type(exc).__name__) from None
        connection = http.client.HTTPSConnection(host, timeout=_TIMEOUT_S, context=context)
    else:
        connection = http.client.HTTPConnection(host, timeout=_TIMEOUT_S)
    try:
        while True:
            query = {"list-type": "2", "prefix": prefix, "encoding-type": "url", "max-keys": str(page_size)}
            if token[0] is not None:
                query["continuation-token"] = token[0]
            if delimiter is not None:
                query["delimiter"] = delimiter
            canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
            try:
                headers = sign(credentials, "GET", host, path, canonical_query, time.time())
                connection.request("GET", f"{path}?{canonical_query}", headers=headers)
                response = connection.getresponse()
                body = response.read()
                if response.status != 200:
                    raise _NotPlain(f"HTTP {response.status}")
                page, following = _parse(body)
            except (OSError, http.client.HTTPException, ElementTree.ParseError, ValueError) as exc:
                raise _NotPlain(type(exc).__name__) from None
            yield page
            if following is None:
                return
            token[0] = following
    finally:
        connection.close()


def _target(credentials: S3Credentials, bucket: str, environ: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(scheme, host header, path) of the bucket's listing, addressed as the engine's boto3 client
    addresses it (path style for an endpoint, virtual-hosted on AWS), or None if this is not the
    plain case — which keys make: a cloud identity's credentials come from boto3's chain."""
    if credentials.pod_identity:
        return None
    config = environ.get("AWS_CONFIG_FILE") or Path(environ.get("HOME") or "~").expanduser() / ".aws" / "config"
    if os.path.exists(config):
        return None
    if credentials.endpoint_url:
        url = urlsplit(credentials.endpoint_url)
        if url.scheme not in ("http", "https") or not url.hostname or "@" in url.netloc or url.path.strip("/"):
            return None
        target = url.scheme, url.netloc, f"/{bucket}"
    else:
        region = credentials.region
        if (any(environ.get(name) for name in _AWS_ENDPOINT_VARIABLES)
                or region.startswith(("cn-", "us-gov-", "us-iso"))):
            return None
        if "." in bucket:  # a dotted name breaks the TLS wildcard: botocore uses path style too
            target = "https", f"s3.{region}.amazonaws.com", f"/{bucket}"
        else:
            target = "https", f"{bucket}.s3.{region}.amazonaws.com", "/"
    return None if _proxied(target[1], environ) else target


def _proxied(host: str, environ: Mapping[str, str]) -> bool:
    """Whether a proxy variable applies to ``host`` (``NO_PROXY`` exempts it, as for botocore)."""
    if not any(environ.get(name) for name in _PROXY_VARIABLES):
        return False
    from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]  # in CPython, undocumented: not in typeshed

    return not proxy_bypass_environment(host, {"no": environ.get("NO_PROXY") or environ.get("no_proxy") or ""})


def sign(credentials: S3Credentials, method: str, host: str, path: str, canonical_query: str,
         now: float) -> dict[str, str]:
    """The headers of an AWS Signature Version 4 request with an empty body.

    ``path`` must already be URI-encoded (S3 signs it as sent); ``canonical_query`` is the
    sorted, encoded query string, sent exactly as signed.
    """
    assert credentials.secret_access_key is not None, "a cloud identity is never signed here (see _target)"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    headers = {"host": host, "x-amz-content-sha256": _EMPTY_SHA256, "x-amz-date": stamp}
    if credentials.session_token:
        headers["x-amz-security-token"] = credentials.session_token
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, path, canonical_query, *(f"{name}:{headers[name]}" for name in sorted(headers)),
                           "", signed, _EMPTY_SHA256])
    scope = f"{stamp[:8]}/{credentials.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + credentials.secret_access_key).encode()
    for part in (stamp[:8], credentials.region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
                                f"SignedHeaders={signed}, Signature={signature}")
    return headers


def _quote(text: str) -> str:
    return quote(text, safe="-_.~")


def _parse(body: bytes) -> tuple[Page, str | None]:
    """One ListObjectsV2 result: the page in botocore's shape, and the next continuation token
    (None on the last page). Keys and common prefixes are decoded exactly when the server says it
    encoded them."""
    root = ElementTree.fromstring(body)
    if root.tag != f"{_NS}ListBucketResult":
        raise ValueError(f"not a ListBucketResult: {root.tag}")
    encoded = root.findtext(f"{_NS}EncodingType") == "url"
    contents = []
    for item in root.iterfind(f"{_NS}Contents"):
        key, size = item.findtext(f"{_NS}Key"), item.findtext(f"{_NS}Size")
        if key is None or size is None:
            raise ValueError("a Contents entry without Key or Size")
        contents.append({"Key": unquote_plus(key) if encoded else key, "Size": int(size),
                         "ETag": item.findtext(f"{_NS}ETag"), "LastModified": item.findtext(f"{_NS}LastModified")})
    common = []
    for item in root.iterfind(f"{_NS}CommonPrefixes"):
        name = item.findtext(f"{_NS}Prefix")
        if name is None:
            raise ValueError("a CommonPrefixes entry without Prefix")
        common.append({"Prefix": unquote_plus(name) if encoded else name})
    truncated = root.findtext(f"{_NS}IsTruncated") == "true"
    token = root.findtext(f"{_NS}NextContinuationToken") if truncated else None
    if truncated and not token:
        raise ValueError("a truncated page without a continuation token")
    return {"Contents": contents, **({"CommonPrefixes": common} if common else {}), "IsTruncated": truncated}, token
