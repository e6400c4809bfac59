"""The "is it already right?" decision, isolated so it can be swapped or tested alone.

Both directions ask the same question — does this local file hold exactly the bytes of that
object? — so one :class:`ContentStrategy` serves download and upload. It never guesses from
timestamps: a size mismatch means "changed", otherwise content decides (see ``digests``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..fs.digest import file_digest
from .digests import DigestStore, is_md5_etag, multipart_count, multipart_etag
from .local_walk import LocalFile

#: Given a key and its multipart ETag, return the part size the object was uploaded with
#: (HEAD ?partNumber=1), or None if it cannot be known.
PartSizeProbe = Callable[[str], int | None]


class ContentStrategy:
    def __init__(self, store: DigestStore, part_size_of: PartSizeProbe,
                 on_chunk: Callable[[], None] | None = None) -> None:
        self._store = store
        self._part_size_of = part_size_of
        #: Told of each chunk hashed (the upload lock is renewed while its upload moves).
        self._on_chunk = on_chunk

    def unchanged(self, local: LocalFile | None, key: str, size: int, etag: str) -> bool:
        """True when ``local`` already holds the object ``key`` of ``size`` and ``etag``."""
        if local is None or local.size != size:
            return False
        entry = self._store.trusted(local)
        if entry is not None and entry.etag == etag:
            return True
        md5 = entry.md5 if entry is not None else None
        if md5 is None:
            md5 = file_digest(local.path, "md5", identity=local.identity, size=local.size, on_chunk=self._on_chunk)
            # A racy entry with the same stat is still knowledge once the content verifies: its
            # recorded ETag (exact even for non-MD5 ETags) carries over when the bytes are the
            # ones it was recorded for.
            racy = self._store.same_stat(local)
            verified = racy is not None and md5 in (racy.md5, racy.etag)
            entry = self._store.record(local, md5=md5, keep=racy if verified else None)
            if entry.etag == etag:
                return True
        if is_md5_etag(etag):
            same = md5 == etag.lower()
        elif (parts := multipart_count(etag)) is not None:
            same = self._multipart_matches(local, key, etag, parts, entry.multipart if entry else {})
        else:
            same = False  # an opaque ETag (e.g. SSE-KMS) we did not record: transfer again
        if same:
            self._store.record(local, etag=etag, keep=self._store.trusted(local) or entry)
        return same

    def _multipart_matches(self, local: LocalFile, key: str, etag: str, parts: int, known: dict[str, str]) -> bool:
        if etag in known.values():
            return True
        part_size = self._part_size_of(key)
        if not part_size or -(-local.size // part_size) != parts:
            return False
        computed = known.get(str(part_size)) or multipart_etag(local, part_size, self._on_chunk)
        self._store.record(local, multipart={str(part_size): computed}, keep=self._store.trusted(local))
        return computed == etag
