"""Reading an annotation's references: the files its key columns name, from parquet (only the key
columns, batch by batch), JSON Lines, JSON or CSV (gzip allowed for the text formats), with no
S3 in sight — so a task can validate an annotation, or count its references, before anything moves.

Reference rules (the same for every format):

* A cell holds one path, or a list of paths (every element counts; an empty list counts
  nothing). A null, missing, empty or non-string cell is a malformed annotation: the error
  names the file and the row.
* References are paths relative to ``src_prefix`` and are normalised as POSIX paths before the
  one confinement check (:func:`tao_data_io.fs.confinement.check_relative`): runs of ``/``
  collapse to one and ``.`` components are dropped, so ``./a.mp4``, ``a.mp4`` and
  ``.//a.mp4`` are one file, as they are on disk. A leading ``/`` (absolute), a trailing ``/``
  or ``.`` (a folder, not a file), ``..``, backslashes and control characters are never
  rewritten: the reference is refused, naming it. Whitespace is kept (it is a legal key).
* References are de-duplicated after normalisation and sorted, so the plan is deterministic.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from ...errors import UnsafePathError, UsageError
from ...fs.confinement import check_relative
from ...vocabulary import ANNOTATION_FORMATS

_EXTENSIONS = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv"}
_GZIP_MAGIC = b"\x1f\x8b"
_SLASH_RUNS = re.compile(r"/{2,}")
#: Rows per parquet/csv batch: bounds memory on million-row annotations.
_BATCH_ROWS = 131_072


def infer_format(name: str) -> str:
    """The annotation format from a file name (``.gz`` allowed for the text formats)."""
    lowered = name.lower()
    base = lowered.removesuffix(".gz")
    for extension, fmt in _EXTENSIONS.items():
        if base.endswith(extension) and not (fmt == "parquet" and base != lowered):
            return fmt
    raise UsageError(
        f"annotation {name!r}: cannot tell its format from the extension (known: .parquet, .jsonl, .ndjson, "
        f".json, .csv, and .gz of the text ones); rename it or set format to one of {', '.join(ANNOTATION_FORMATS)}"
    )


def read_references(path: str | os.PathLike[str], keys: Sequence[str], fmt: str | None = None, *,
                    label: str | None = None) -> list[str]:
    """The normalised, de-duplicated, sorted file references in ``keys`` columns of an annotation.

    ``label`` names the file in error messages (e.g. the ``s3://`` URI it was fetched from).
    Raises :class:`UsageError` for an unknown format, a missing column, a malformed row or an
    unsafe reference — each naming the file, and the row or the reference.
    """
    label = label or str(path)
    keys = check_keys(keys)
    if not os.path.isfile(path):
        raise UsageError(f"annotation {label!r} is not a file; give a local path or an s3://BUCKET/KEY object")
    fmt = fmt or infer_format(os.path.basename(label))
    if fmt not in ANNOTATION_FORMATS:
        raise UsageError(f"format {fmt!r} for {label} is not supported; use one of {', '.join(ANNOTATION_FORMATS)}")
    references: set[str] = set()
    reader = {"parquet": _read_parquet, "jsonl": _read_jsonl, "json": _read_json, "csv": _read_csv}[fmt]
    reader(Path(path), keys, label, references)
    return sorted(references)


def check_keys(keys: Sequence[str]) -> tuple[str, ...]:
    """Column names, de-duplicated in order; at least one, none empty."""
    if isinstance(keys, str):
        keys = [keys]
    unique = tuple(dict.fromkeys(keys))
    if not unique or any(not key for key in unique):
        raise UsageError(f"keys {list(keys)!r}: give at least one non-empty column name, e.g. video_path")
    return unique


def normalise_reference(raw: str) -> str:
    """``raw`` as a canonical relative path (see the module docstring), or :class:`UnsafePathError`."""
    text = _SLASH_RUNS.sub("/", raw) if "//" in raw else raw
    if text.startswith("./") or "/./" in text:
        parts = text.split("/")
        text = "/".join([part for part in parts[:-1] if part != "."] + parts[-1:])
    try:
        return check_relative(text, what="reference")
    except UnsafePathError as exc:
        raise UnsafePathError(f"{exc}" + ("" if text == raw else f" (written {raw!r})")) from exc


def _add(references: set[str], raw: str, label: str, locate: Callable[[str], str], key: str) -> None:
    """Normalise ``raw`` into ``references`` unless already there. Normalising as values arrive
    (not after collecting them) keeps one set of strings in memory, not two; ``locate`` finds
    the row holding a value, called only when that value is refused."""
    if raw not in references:
        try:
            references.add(normalise_reference(raw))
        except UnsafePathError as exc:
            raise UnsafePathError(f"{label}, {locate(raw)}, column {key!r}: {exc}; fix the annotation") from exc


def _add_cell(value: Any, references: set[str], label: str, where: str, key: str) -> None:
    """Add a cell's reference(s); a cell that names no file is a malformed row."""
    values = value if isinstance(value, list) else [value]
    locate: Callable[[str], str] = lambda _raw: where  # noqa: E731 - the row is known here
    for item in values:
        if not isinstance(item, str):
            shown = "null" if item is None else f"a {type(item).__name__} ({item!r:.40})"
            raise UsageError(f"{label}, {where}, column {key!r}: {shown} where a file path was expected; "
                             "every key column cell must be a path or a list of paths")
        if not item:
            raise UsageError(f"{label}, {where}, column {key!r}: empty value; every key column cell must name a file")
        _add(references, item, label, locate, key)


def _missing_column(key: str, label: str, columns: Iterable[str]) -> UsageError:
    names = list(dict.fromkeys(columns))
    shown = ", ".join(repr(name) for name in names[:30]) + (f" … ({len(names)} in all)" if len(names) > 30 else "")
    return UsageError(f"{label}: no column {key!r}; its columns are {shown or '(none)'}; name one of them in keys")


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(2) == _GZIP_MAGIC


def _open_text(path: Path) -> io.TextIOWrapper:
    """Open a text annotation, decompressing gzip by its magic bytes (not its name)."""
    if _is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")  # the caller closes it


def _read_parquet(path: Path, keys: tuple[str, ...], label: str, references: set[str]) -> None:
    """Read only the key columns (projection), batch by batch, checking nulls and empties with
    Arrow kernels and handing Python only each batch's distinct values."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UsageError(f"{label}: not a readable parquet file ({exc}); "
                         "check the file or set the right format") from exc
    schema = parquet.schema_arrow
    for key in keys:
        if key not in schema.names:
            raise _missing_column(key, label, schema.names)
        kind = schema.field(key).type
        element = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else kind
        if not (pa.types.is_string(element) or pa.types.is_large_string(element)):
            raise UsageError(f"{label}: column {key!r} has type {kind}; a key column must hold paths "
                             "(string or list of strings)")
    offset = 0
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=list(keys)):
        for key in keys:
            column, parents = batch.column(key), None
            if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
                _raise_at(pc.is_null(column), None, "null", label, offset, key)
                column, parents = pc.list_flatten(column), pc.list_parent_indices(column)
            _raise_at(pc.is_null(column), parents, "null", label, offset, key)
            _raise_at(pc.equal(column, ""), parents, "empty value", label, offset, key)
            locate = functools.partial(_parquet_row, column, parents, offset)
            for value in pc.unique(column).to_pylist():
                _add(references, value, label, locate, key)
        offset += batch.num_rows


def _raise_at(bad: Any, parents: Any, problem: str, label: str, offset: int, key: str) -> None:
    """Raise naming the first row where the boolean array ``bad`` is true (``parents`` maps
    flattened list elements back to their rows)."""
    import pyarrow.compute as pc

    index = pc.index(bad.fill_null(False), True).as_py()
    if index < 0:
        return
    row = offset + (parents[index].as_py() if parents is not None else index) + 1
    raise UsageError(f"{label}, row {row}, column {key!r}: {problem} where a file path was expected; "
                     "every key column cell must name a file")


def _parquet_row(column: Any, parents: Any, offset: int, value: str) -> str:
    """The first row holding ``value`` (for an error message only)."""
    import pyarrow.compute as pc

    index = pc.index(column, value).as_py()
    return f"row {offset + (parents[index].as_py() if parents is not None else index) + 1}"


def _read_jsonl(path: Path, keys: tuple[str, ...], label: str, references: set[str]) -> None:
    """Stream line by line; a key no line has is a missing column, a key some lines lack is a
    malformed row (decided at the end, when both are known)."""
    columns: dict[str, None] = {}
    first_without: dict[str, int] = {}
    number = 0
    try:
        with _open_text(path) as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise UsageError(f"{label}, line {number}: not valid JSON ({exc}); "
                                     "each line of a JSONL annotation must be one JSON object") from exc
                if not isinstance(record, dict):
                    raise UsageError(f"{label}, line {number}: a JSON {type(record).__name__} "
                                     "where an object was expected")
                columns.update(dict.fromkeys(record))
                for key in keys:
                    if key in record:
                        _add_cell(record[key], references, label, f"line {number}", key)
                    else:
                        first_without.setdefault(key, number)
    except (UnicodeDecodeError, EOFError, OSError) as exc:
        raise UsageError(f"{label}, after line {number}: cannot be read as UTF-8 JSONL ({exc})") from exc
    for key in keys:
        if key not in columns:
            raise _missing_column(key, label, columns)
        if key in first_without:
            raise UsageError(f"{label}, line {first_without[key]}: no {key!r} (other lines have it); "
                             "every row must reference a file in each key column")


def _read_json(path: Path, keys: tuple[str, ...], label: str, references: set[str]) -> None:
    """A list of records, or an object holding record lists at any depth (COCO: ``images``).
    Every list of objects in which some record has a key is read; lists without any key
    (COCO's ``annotations``, ``categories``) are ignored."""
    try:
        with _open_text(path) as handle:
            data = json.load(handle)
    except (ValueError, EOFError, OSError) as exc:
        raise UsageError(f"{label}: not valid JSON ({exc}); set the right format") from exc
    found: set[str] = set()
    lists = list(_record_lists(data, "$"))
    if not lists:
        raise UsageError(f"{label}: holds no list of records (JSON objects); expected [{{...}}, ...] "
                         'or an object holding such lists, like COCO\'s {"images": [{...}, ...]}')
    for where, records in lists:
        present = [key for key in keys if any(isinstance(r, dict) and key in r for r in records)]
        if not present:
            continue
        found.update(present)
        for index, record in enumerate(records):
            row = f"{where}[{index}]"
            if not isinstance(record, dict):
                raise UsageError(f"{label}, {row}: a JSON {type(record).__name__} in a list of records")
            for key in present:
                if key not in record:
                    raise UsageError(f"{label}, {row}: no {key!r} (other records in {where} have it); "
                                     "every record must reference a file in each key field")
                _add_cell(record[key], references, label, row, key)
    for key in keys:
        if key not in found:
            fields = (name for _, records in lists for r in records if isinstance(r, dict) for name in r)
            raise _missing_column(key, label, fields)


def _record_lists(node: Any, where: str) -> Iterator[tuple[str, list[Any]]]:
    """Every list holding at least one object, found through nested objects (not inside lists)."""
    if isinstance(node, list):
        if any(isinstance(item, dict) for item in node):
            yield where, node
    elif isinstance(node, dict):
        for name, value in node.items():
            yield from _record_lists(value, f"{where}.{name}")


def _csv_line(column: Any, first_line: int, value: str) -> str:
    """The line of the first cell holding ``value`` (for an error message only)."""
    return f"line {first_line + int((column == value).to_numpy().argmax())}"


def _read_csv(path: Path, keys: tuple[str, ...], label: str, references: set[str]) -> None:
    """Read only the key columns (``usecols``) as strings, in chunks. Cells are single paths:
    CSV has no list type. Line numbers count the header as line 1."""
    import pandas as pd

    compression: Literal["gzip"] | None = "gzip" if _is_gzip(path) else None
    try:
        columns = list(pd.read_csv(path, nrows=0, compression=compression).columns)
        for key in keys:
            if key not in columns:
                raise _missing_column(key, label, columns)
        line = 2
        for chunk in pd.read_csv(path, usecols=list(keys), dtype=str, na_filter=False, skip_blank_lines=False,
                                 chunksize=_BATCH_ROWS, compression=compression):
            for key in keys:
                column = chunk[key]
                empty = (column == "").to_numpy().nonzero()[0]
                if len(empty):
                    raise UsageError(f"{label}, line {line + int(empty[0])}, column {key!r}: empty value; "
                                     "every key column cell must name a file")
                locate = functools.partial(_csv_line, column, line)
                for value in column.unique():
                    _add(references, value, label, locate, key)
            line += len(chunk)
    except UsageError:
        raise
    except (ValueError, EOFError, OSError) as exc:  # pandas' ParserError and UnicodeDecodeError are ValueErrors
        raise UsageError(f"{label}: cannot be read as CSV ({exc}); check the file or set the right format") from exc
