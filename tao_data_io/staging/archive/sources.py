"""Where an archive's bytes come from — a local file or an ``s3://`` object — with the identity
the marker compares (local: size and SHA-256; S3: bucket, key, size and ETag from one HEAD) and
one sequential read (an S3 object that changes while it is read is refused)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ...errors import TransferError, UsageError
from ...fs.confinement import is_within
from ...fs.digest import file_digest
from ...transfer.client import explained, head_or_none
from ...uris import S3Url


@dataclass(frozen=True)
class Source:
    #: How messages name the archive: the path or the s3:// URL.
    label: str
    #: What makes two archives the same (compared with the marker's).
    identity: dict[str, Any]
    #: Opens the archive's bytes for one sequential read.
    open: Callable[[], AbstractContextManager[IO[bytes]]]


def local_source(path: Path, dest: Path) -> Source:
    label = str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"archive {label!r} does not exist; check the path") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"archive {label!r} is not a regular file; give the path of a tar or zip file")
    if is_within(path, dest):
        raise UsageError(f"archive {label!r} is inside the destination {str(dest)!r}, which extraction replaces; "
                         "move the archive or choose another destination")
    identity = {"kind": "file", "size": os.stat(path).st_size, "sha256": file_digest(path, "sha256")}
    return Source(label, identity, lambda: open(path, "rb"))


def s3_source(url: S3Url, client: Any) -> Source:
    if url.is_prefix:
        raise UsageError(f"archive {str(url)!r} names a prefix, not an object; write s3://BUCKET/path/to/archive.tar.gz")
    head = head_or_none(client, url.bucket, url.key)
    if head is None:
        raise UsageError(f"archive {str(url)!r} does not exist (404); check the bucket and key")
    identity = {"kind": "s3", "bucket": url.bucket, "key": url.key, "size": int(head["ContentLength"]),
                "etag": str(head.get("ETag", "")).strip('"')}

    @contextmanager
    def open_body() -> Iterator[IO[bytes]]:
        with explained(url.bucket, client.meta.endpoint_url):
            response = client.get_object(Bucket=url.bucket, Key=url.key)
        with closing(response["Body"]) as body:
            etag = str(response.get("ETag", "")).strip('"')
            if etag != identity["etag"] or int(response["ContentLength"]) != identity["size"]:
                raise TransferError(f"archive {str(url)!r} changed while being read "
                                    f"(ETag {identity['etag']} → {etag}); rerun to extract the new version")
            yield body

    return Source(str(url), identity, open_body)
