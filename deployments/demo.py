"""The main job on the embedded default: `make demo`.

Until the submit/collect flows land, the main job is a real `tao-data-io sync` round trip
against the embedded S3 server — exactly the commands a user types, with the credentials in
the child's environment only:

1. start SeaweedFS on 127.0.0.1 with random credentials;
2. make a small TAO-shaped dataset (images + a COCO-style annotation) and a results tree;
3. `tao-data-io sync DATASET s3://…/datasets/` (upload), then the same back into a staging
   directory (download), and verify the trees are byte-identical;
4. rerun the download to show that nothing moves twice;
5. upload results with `--exclude '.tao/*'` to `s3://…/results/<job id>/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tao_data_io.embedded_s3 import EmbeddedS3

WORKDIR = Path(os.environ.get("TAO_DATA_IO_DEMO_DIR", ".demo")).resolve()
BUCKET = "tao-demo"


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".tao-data-io" not in p.parts}


def _make_dataset(root: Path) -> None:
    images = []
    for i in range(200):
        path = root / "images" / f"{i // 50:02d}" / f"img-{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hashlib.sha256(str(i).encode()).digest() * 256)
        images.append({"id": i, "file_name": path.relative_to(root).as_posix()})
    (root / "annotations.json").write_text(json.dumps({"images": images, "annotations": []}))


def _make_results(root: Path) -> None:
    (root / ".tao").mkdir(parents=True, exist_ok=True)
    (root / ".tao" / "status.json").write_text('{"internal": true}')
    (root / "checkpoints").mkdir(exist_ok=True)
    (root / "checkpoints" / "epoch_001.pth").write_bytes(os.urandom(512 * 1024))
    (root / "train.log").write_text("epoch 1 loss 0.42\n")


def _cli(env: dict[str, str], *args: str) -> None:
    print(f"\n$ tao-data-io {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "tao_data_io.cli", *args], env=env, check=True)


def main() -> int:
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    print("tao-data-io demo: a real sync round trip against the embedded S3 server "
          "(the submit/collect flows will replace this once they exist)")
    with EmbeddedS3(WORKDIR / "s3") as server:
        server.create_bucket(BUCKET)
        print(f"embedded S3 (SeaweedFS) on {server.endpoint_url}, bucket s3://{BUCKET}/")
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(WORKDIR)), **server.env()}
        dataset, stage, results = WORKDIR / "dataset", WORKDIR / "stage", WORKDIR / "results"
        _make_dataset(dataset)
        _make_results(results)

        _cli(env, "sync", str(dataset), f"s3://{BUCKET}/datasets/coco-mini/")
        _cli(env, "sync", f"s3://{BUCKET}/datasets/coco-mini/", str(stage))
        if _digest(stage) != _digest(dataset):
            print("FAILED: the staged tree differs from the source", file=sys.stderr)
            return 1
        print("verified: the staged tree is byte-identical to the source")
        _cli(env, "sync", f"s3://{BUCKET}/datasets/coco-mini/", str(stage))
        _cli(env, "sync", str(results), f"s3://{BUCKET}/results/demo-job/", "--exclude", ".tao/*")
    print(f"\ndemo complete; files are under {WORKDIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
