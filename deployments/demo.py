"""The main job on the embedded default: `make demo`.

Until the submit/collect flows land, the main job is the data mover's own steps run as a user
types them, against the embedded S3 server, with credentials in the child's environment only:

1. start SeaweedFS on 127.0.0.1 with random credentials;
2. make a small TAO-shaped dataset (images, a COCO-style annotation, a clip list, an archive);
3. `tao-data-io sync` it up and back down, verify the trees are byte-identical, and rerun the
   download to show that nothing moves twice;
4. `tao-data-io stage` a config-mode job request (a folder, a file, an annotation-selective
   input and an archive), printing the staging map and the materialized config;
5. `record open`, `route-outputs --record` (S3_BUCKET_NAME set → s3://…/results/<id>/),
   `record mark … ERROR` and `upload-results` — results are uploaded even for a failed job,
   and `.tao/*` never leaves the machine. The record lives in the bucket
   (`TAO_DATA_IO_RECORDS=s3://…/tao-data-io/jobs/`), where every pod of a flow would find it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from tao_data_io.embedded.s3 import EmbeddedS3

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


def _make_inputs(root: Path) -> None:
    """A clip list that references 3 of the 5 clips, the clips, and a calibration archive."""
    for i in range(5):
        (root / "clips").mkdir(parents=True, exist_ok=True)
        (root / "clips" / f"clip-{i}.mp4").write_bytes(hashlib.sha256(f"clip{i}".encode()).digest() * 64)
    (root / "clips" / "train.jsonl").write_text("".join(json.dumps({"video": f"./clip-{i}.mp4"}) + "\n"
                                                        for i in (0, 2, 4)))
    with tarfile.open(root / "calib.tar.gz", "w:gz") as tar:
        for name in ("calib/table.bin", "calib/info.txt"):
            data = name.encode() * 10
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


REQUEST = """\
schema_version: "1"
job_id: demo-job
image: nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt
command: dino train -e {{config_path}}
mode: config
config_format: yaml
spec:
  dataset:
    train_data_sources:
      - image_dir: s3://{bucket}/datasets/coco-mini/images/
        json_file: s3://{bucket}/datasets/coco-mini/annotations.json
  train: {{num_epochs: 1}}
inputs:
  - source: s3://{bucket}/inputs/clips/
    kind: selective
    annotation: s3://{bucket}/inputs/clips/train.jsonl
    keys: [video]
    target: /data/clips
  - source: s3://{bucket}/inputs/calib.tar.gz
    kind: archive
    strip_components: 1
    target: /data/calib
outputs:
  results_dir: /results
  upload_excludes: ["*.tmp"]
forward_env: [AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY]
"""


def _make_results(root: Path) -> None:
    (root / ".tao").mkdir(parents=True, exist_ok=True)
    (root / ".tao" / "status.json").write_text('{"internal": true}')
    (root / "checkpoints").mkdir(exist_ok=True)
    (root / "checkpoints" / "epoch_001.pth").write_bytes(os.urandom(512 * 1024))
    (root / "train.log").write_text("epoch 1 loss 0.42\n")
    (root / "scratch.tmp").write_text("excluded by the request's upload_excludes")


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

        inputs, workdir = WORKDIR / "inputs", WORKDIR / "workdir"
        _make_inputs(inputs)
        _cli(env, "sync", str(inputs), f"s3://{BUCKET}/inputs/")
        request = WORKDIR / "request.yaml"
        request.write_text(REQUEST.format(bucket=BUCKET))
        _cli(env, "stage", "--request", str(request), "--workdir", str(workdir))
        _cli(env, "stage", "--request", str(request), "--workdir", str(workdir))  # a rerun moves nothing
        config = next((workdir / "config").glob("tao-action-config-*.yaml"))
        print(f"\nmaterialized config ({config.name}), remote URIs rewritten:\n{config.read_text()}")

        jobs = {**env, "TAO_DATA_IO_RECORDS": f"s3://{BUCKET}/tao-data-io/jobs/", "S3_BUCKET_NAME": BUCKET}
        _cli(jobs, "record", "open", "--job-id", "demo-job", "--platform", "local", "--image", "tao:6",
             "--network-arch", "dino", "--action", "train", "--storage-tier", "C", "--results-dir", "/results",
             "--upload-exclude", "*.tmp")
        _cli(jobs, "route-outputs", "--job-id", "demo-job", "--record")
        _cli(jobs, "record", "mark", "demo-job", "--state", "ERROR", "--message", "demo: the job failed")
        _cli(jobs, "upload-results", "--job-id", "demo-job", "--results-dir", str(results))
        _cli(jobs, "record", "show", "demo-job")
        _cli(jobs, "record", "list", "--state", "ERROR")
    print(f"\ndemo complete; files are under {WORKDIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
