"""Annotation-selective download: stage only the objects an annotation file references.

A training split often uses a few thousand clips out of a bucket of millions. Listing the
prefix and filtering would cost time proportional to the bucket; here the annotation is the
plan: its key columns name the files, each reference becomes one key under ``src_prefix``,
and :meth:`TransferEngine.download_keys` fetches exactly those keys — no listing, so the cost
grows with the number of references.

Reading is split from downloading: :mod:`.annotations` reads the references (pure, no S3), so a
Prefect task or the staging step can validate an annotation, or count its references, without
touching S3; :mod:`.download` fetches them.
"""

from .annotations import read_references
from .download import MISSING_REPORT, MissingReferencesError, SelectiveResult, selective_download

__all__ = ["MISSING_REPORT", "MissingReferencesError", "SelectiveResult", "read_references", "selective_download"]
