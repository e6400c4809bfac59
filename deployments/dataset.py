"""The demo's small, real-looking TAO dataset: PNG images, a parquet annotation of the validation
split, a calibration archive, and a tiny model for the model hub stand-in — built from a seed so
every run makes the same bytes (a rerun of the demo against the same bucket moves nothing).

Layout under ``root``::

    bucket/datasets/demo-coco/images/train/img-0000.png …   (a folder input, via the spec)
    bucket/datasets/demo-coco/images/val/img-0000.png …     (an annotation-selective input)
    bucket/datasets/demo-coco/annotations/val.parquet        (references 12 of the 16 val images)
    bucket/datasets/demo-coco/calibration.tar.gz             (an archive input)
    hub/nvidia/tao-demo-detector/                            (config.json, model.safetensors, README.md)
"""

from __future__ import annotations

import gzip
import io
import json
import random
import struct
import tarfile
import zlib
from pathlib import Path

PREFIX = "datasets/demo-coco"
MODEL_REPO = "nvidia/tao-demo-detector"
CLASSES = ("person", "bicycle", "car")
TRAIN_IMAGES, VAL_IMAGES, VAL_ANNOTATED = 48, 16, 12
SIDE = 96


def png(width: int, height: int, pixel: tuple[int, int, int], rng: random.Random) -> bytes:
    """An RGB PNG: a colour gradient with noise, so every image differs and compresses like a photo
    (rows are shifted noise through a byte table: C speed, no per-pixel Python)."""
    tint = bytes(pixel) * width
    rows = bytearray()
    for y in range(height):
        shift = bytes((value // 6 + y) % 256 for value in range(256))
        noise = rng.randbytes(3 * width).translate(shift)
        rows += b"\0" + bytes(a ^ b for a, b in zip(noise, tint, strict=True))
    return _png_file(width, height, bytes(rows))


def _png_file(width: int, height: int, rows: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + \
        chunk(b"IEND", b"")


def build(root: Path, seed: int = 42) -> tuple[Path, Path]:
    """Write the dataset under ``root``; returns (the tree to upload to the bucket, the model repo)."""
    rng = random.Random(seed)
    data = root / "bucket" / PREFIX
    for split, count in (("train", TRAIN_IMAGES), ("val", VAL_IMAGES)):
        (data / "images" / split).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
            (data / "images" / split / f"img-{index:04d}.png").write_bytes(png(SIDE, SIDE, colour, rng))
    _annotation(data / "annotations" / "val.parquet", rng)
    _archive(data / "calibration.tar.gz", rng)
    model = root / "hub" / MODEL_REPO
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architecture": "dino", "backbone": "resnet50",
                                                   "num_classes": len(CLASSES)}, indent=2) + "\n")
    (model / "model.safetensors").write_bytes(rng.randbytes(256 * 1024))
    (model / "README.md").write_text("# tao-demo-detector\n\nA stand-in model for the tao-data-io demo.\n")
    return root / "bucket", model


def _annotation(path: Path, rng: random.Random) -> None:
    """COCO-like rows for the annotated validation images, as parquet (what TAO's loaders read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chosen = sorted(rng.sample(range(VAL_IMAGES), VAL_ANNOTATED))
    rows = [{"file_name": f"img-{index:04d}.png", "width": SIDE, "height": SIDE,
             "category": rng.choice(CLASSES), "bbox": [rng.randrange(40), rng.randrange(40), 32, 32]}
            for index in chosen]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _archive(path: Path, rng: random.Random) -> None:
    """An INT8 calibration cache and its notes under one top directory (stripped when staged),
    with fixed times in the tar and the gzip header, so the archive's bytes repeat too."""
    members = {"calibration/cal.bin": rng.randbytes(64 * 1024),
               "calibration/README.txt": b"INT8 calibration cache for the demo detector\n"}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
            archive.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
