"""S3 writes that happen only if the object is still as we last saw it.

Why one module: the record storage and the upload lease both depend on the same two promises —
``If-None-Match: *`` creates only what does not exist, ``If-Match: <etag>`` replaces or deletes
only the version we read — and on reading a refusal the same way. A refused condition is an
answer, not an error: the caller re-reads and decides again.
"""

from __future__ import annotations

from typing import Any

from ..transfer.client import explained

#: Answers that mean "the condition did not hold": 412 Precondition Failed; 409 when a
#: conflicting write was in flight; 404 when ``If-Match`` names an object that is gone.
CONDITION_FAILED = frozenset({404, 409, 412})


def _refused(exc: Any) -> bool:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) in CONDITION_FAILED


def put_if(client: Any, bucket: str, key: str, data: bytes, **condition: str) -> str | None:
    """PUT ``data`` if ``condition`` (``IfNoneMatch="*"`` or ``IfMatch=etag``) holds: the new
    ETag, or None when it did not hold and nothing was written."""
    with explained(bucket, client.meta.endpoint_url):
        try:
            answer = client.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json",
                                       **condition)
        except client.exceptions.ClientError as exc:  # the client's own class: no botocore import to load
            if _refused(exc):
                return None
            raise
    return str(answer["ETag"])


def delete_if(client: Any, bucket: str, key: str, etag: str) -> bool:
    """DELETE ``key`` if it is still at ``etag``; False when it changed or is gone."""
    with explained(bucket, client.meta.endpoint_url):
        try:
            client.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
        except client.exceptions.ClientError as exc:
            if _refused(exc):
                return False
            raise
    return True
