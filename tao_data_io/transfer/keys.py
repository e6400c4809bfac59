"""What a local file's name may become as an S3 key.

Why a module of its own: the upload decides it per file (a name no key can carry is skipped once,
with the fix, not failed on every rerun), and the destination's index (:mod:`.remote_index`)
looks up only keys a listing can hold; neither owns the rule.
"""

from __future__ import annotations

from ..fs.confinement import has_control_character

#: The longest key S3 stores (UTF-8 bytes).
MAX_KEY_BYTES = 1024


def unsendable_name(key: str) -> str | None:
    """Why a local file cannot become the S3 key ``key`` — a control character (object_store's
    paths refuse them, and they break listings and most tools), a name that is not UTF-8, more
    than S3's 1024 bytes — or None. Such a file is skipped once, with the fix, rather than failed
    on every rerun."""
    if has_control_character(key):
        problem = "holds a control character, which an S3 key here cannot carry"
    else:
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            return "its name is not UTF-8, which an S3 key must be; not uploaded — rename it to upload it"
        if size <= MAX_KEY_BYTES:
            return None
        problem = f"makes a key of {size} bytes, more than the {MAX_KEY_BYTES} S3 stores"
    return f"its name {problem}; not uploaded — rename it to upload it"
