"""``s3://bucket/key`` parsing, and the one rule for what a trailing slash means.

Semantics (documented in the README):

* ``s3://b/p/`` names the *prefix* ``p/``: everything under it, with paths relative to it.
* ``s3://b/p`` given to ``sync`` is the same prefix ``p/`` (as ``aws s3 sync`` does) — a
  sync never matches ``p-other/`` or ``p.txt`` by accident.
* ``s3://b/p`` given to ``cp`` is the single object ``p``; ``s3://b/p/`` given to ``cp`` as
  a destination means "put the file under ``p/`` with its own name".
* ``s3://b`` and ``s3://b/`` name the whole bucket.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UsageError

# Bucket names per the S3 rules (3–63 chars, lowercase, digits, dots, hyphens).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Url:
    """A parsed ``s3://`` URL. ``key`` is exactly what followed the bucket (may be empty)."""

    bucket: str
    key: str

    @property
    def is_prefix(self) -> bool:
        """True for ``s3://b``, ``s3://b/`` and ``s3://b/p/``: a folder, not one object."""
        return self.key == "" or self.key.endswith("/")

    def as_prefix(self) -> S3Url:
        """The folder form: ``s3://b/p`` → ``s3://b/p/`` (the bucket root stays empty)."""
        if self.is_prefix:
            return self
        return S3Url(self.bucket, self.key + "/")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def is_s3_url(text: str) -> bool:
    return text.startswith("s3://")


def parse_s3_url(text: str, *, field: str = "url") -> S3Url:
    """Parse ``s3://bucket[/key]``; a bad value raises :class:`UsageError` naming ``field``."""
    if not is_s3_url(text):
        raise UsageError(f"{field}: {text!r} is not an S3 URL; write it as s3://BUCKET/PREFIX/")
    rest = text[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise UsageError(
            f"{field}: bucket {bucket!r} in {text!r} is not a valid S3 bucket name "
            "(3–63 characters: lowercase letters, digits, '.', '-'); write s3://BUCKET/PREFIX/"
        )
    if "\x00" in key:
        raise UsageError(f"{field}: {text!r} contains a NUL character; remove it")
    return S3Url(bucket, key)
