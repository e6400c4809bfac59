"""Real-shaped TAO experiment specs through ``stage``, differentially: OmegaConf — TAO's reader —
reading the spec as the request holds it, against OmegaConf reading the materialized config.
Every value but the URIs comes back with its value and type; every URI comes back as a path in
the frame whose bytes, on this host, are the object's. Written after the structure of
NVIDIA's specs (tao_pytorch_backend: dino, grounding_dino, mask2former, sparse4d;
tao_tensorflow2_backend: efficientdet), with their numeric spellings (``2e-05``, ``1e-4``,
``118_288``), nested URIs (a file inside a staged folder), lists of sources and a date."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tao_data_io.request import load_request
from tao_data_io.staging.stage import stage
from tao_data_io.staging.stage_map import StagingMap

SPECS = {
    "dino": """
model:
  pretrained_backbone_path: s3://{b}/models/dino/resnet50.pth
  backbone: resnet_50
  num_feature_levels: 4
  num_queries: 300
  dropout_ratio: 0.0
train:
  num_gpus: 1
  num_epochs: 12
  optim:
    lr_backbone: 2e-05
    lr: 2e-4
    lr_steps: [11]
    momentum: 0.9
  activation_checkpoint: true
dataset:
  train_data_sources:
    - image_dir: s3://{b}/coco/train2017/
      json_file: s3://{b}/coco/annotations/instances_train2017.json
  val_data_sources:
    image_dir: s3://{b}/coco/val2017/
    json_file: s3://{b}/coco/annotations/instances_val2017.json
  num_classes: 91
  augmentation:
    scales: [480, 512, 544]
    input_mean: [0.485, 0.456, 0.406]
""",
    "grounding_dino": """
model:
  pretrained_backbone_path: s3://{b}/models/gdino/swin_tiny.pth
  text_encoder_type: bert-base-uncased
  max_text_len: 256
  log_scale: auto
train:
  optim:
    lr: 1e-4
    lr_backbone: 1E-5
    weight_decay: .0001
  freeze: ["backbone.0", "bert"]
dataset:
  train_data_sources:
    - image_dir: s3://{b}/odvg/images/
      json_file: s3://{b}/odvg/train.jsonl
      label_map: s3://{b}/odvg/label_map.json
  max_labels: 80
""",
    "sparse4d": """
dataset:
  data_root: s3://{b}/nuscenes/
  ann_file: s3://{b}/nuscenes/nuscenes_infos_train.pkl
  use_valid_flag: yes
model:
  head:
    anchor: s3://{b}/nuscenes/kmeans/kmeans900.npy
    num_anchor: 900
    embed_dims: 256
train:
  optim:
    lr: 6e-4
    weight_decay: 0.001
  num_iters: 1_000
  created: 2024-05-01
""",
    "efficientdet_tf2": """
dataset:
  train_tfrecords: ["s3://{b}/tfrecords/train-00000-of-00002", "s3://{b}/tfrecords/train-00001-of-00002"]
  val_tfrecords: ["s3://{b}/tfrecords/val-00000-of-00001"]
  val_json_file: s3://{b}/coco/annotations/instances_val2017.json
  num_classes: 91
  image_size: 512x512
train:
  lr_schedule:
    learning_rate: 0.08
    warmup_init: 0.008
  l2_weight_decay: 4e-05
  moving_average_decay: 0.9999
  num_examples_per_epoch: 118_288
  amp: True
""",
    "mask2former": """
model:
  export: false
  backbone:
    pretrained_backbone_path: s3://{b}/models/m2f/swin_base.pth
  mask_former:
    num_object_queries: 100
    dropout: 0.0
dataset:
  contiguous_id: true
  label_map: s3://{b}/coco/panoptic/label_map.json
  train:
    panoptic_json: s3://{b}/coco/panoptic/panoptic_train2017.json
    img_dir: s3://{b}/coco/train2017/
    batch_size: 2
  test: {{}}
train:
  optim:
    lr: 0.0001
    weight_decay: 0.05
  precision: fp16
  seed: ~
""",
}


def s3_uris(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [uri for item in value.values() for uri in s3_uris(item)]
    if isinstance(value, list):
        return [uri for item in value for uri in s3_uris(item)]
    return [value] if isinstance(value, str) and value.startswith("s3://") else []


def seed(s3_client: Any, bucket: str, uris: list[str]) -> dict[str, bytes]:
    """An object for each file URI and two under each folder URI: key → bytes."""
    objects: dict[str, bytes] = {}
    for uri in uris:
        key = uri[len(f"s3://{bucket}/"):]
        names = [f"{key}0001.jpg", f"{key}sub/0002.jpg"] if key.endswith("/") else [key]
        for name in names:
            objects[name] = f"bytes of {name}".encode()
    for key, body in objects.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    return objects


def host_path(staged: StagingMap, frame_path: str) -> Path:
    """Where a path the frame sees lies on this host, from the staging map."""
    for entry in sorted(staged.sources, key=lambda e: -len(e.container_path)):
        if entry.local_path and (frame_path == entry.container_path
                                 or frame_path.startswith(entry.container_path + "/")):
            return Path(entry.local_path + frame_path[len(entry.container_path):])
    raise AssertionError(f"{frame_path} is not staged")


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


def compare(original: Any, materialized: Any, staged: StagingMap, objects: dict[str, bytes], bucket: str,
            where: str = "spec") -> None:
    if isinstance(original, dict):
        assert isinstance(materialized, dict) and set(original) == set(materialized), where
        for key in original:
            compare(original[key], materialized[key], staged, objects, bucket, f"{where}.{key}")
    elif isinstance(original, list):
        assert isinstance(materialized, list) and len(original) == len(materialized), where
        for index, (a, b) in enumerate(zip(original, materialized)):
            compare(a, b, staged, objects, bucket, f"{where}[{index}]")
    elif isinstance(original, str) and original.startswith("s3://"):
        key = original[len(f"s3://{bucket}/"):]
        local = host_path(staged, materialized)
        if key.endswith("/"):
            held = {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()}
            assert held == {name[len(key):]: body for name, body in objects.items() if name.startswith(key)}, where
        else:
            assert local.read_bytes() == objects[key], where
    else:
        assert same(original, materialized), (where, original, materialized)


@pytest.mark.parametrize("fmt", ["yaml", "json", "toml"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_real_tao_spec_comes_back_as_tao_read_it_with_every_uri_staged(
        name: str, fmt: str, tmp_path: Path, s3_client: Any, bucket: str, env: dict[str, str]) -> None:
    spec_text = SPECS[name].format(b=bucket)
    taos = OmegaConf.to_container(OmegaConf.create(spec_text))
    if fmt == "toml" and "~" in spec_text:
        taos["train"].pop("seed")  # type: ignore[index, union-attr]  # TOML has no null (refused, named)
        spec_text = spec_text.replace("  seed: ~\n", "")
    objects = seed(s3_client, bucket, s3_uris(taos))
    request = tmp_path / "request.yaml"
    request.write_text(f"schema_version: '1'\nimage: nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt\nmode: config\n"
                       f"config_format: {fmt}\ncommand: {name} train -e {{config_path}}\nspec:\n"
                       + "".join(f"  {line}\n" for line in spec_text.strip("\n").splitlines()))
    staged = stage(load_request(request, environ=env), tmp_path / "work", environ=env)
    text = Path(str(staged.config().local_path)).read_text()  # type: ignore[union-attr]
    materialized = (OmegaConf.to_container(OmegaConf.create(text)) if fmt == "yaml"
                    else json.loads(text) if fmt == "json" else tomllib.loads(text))
    compare(taos, materialized, staged, objects, bucket)
