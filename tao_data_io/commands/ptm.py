"""``pull-model``: a pre-trained model from the Hugging Face Hub or NGC into a directory, verified."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..uris import HF_SHAPE, NGC_SHAPE
from .examples import add_verb

if TYPE_CHECKING:
    from ..console import Console

_ENVIRONMENT = """\
environment:
  HF_TOKEN      Hugging Face token (optional; private and gated repos need one)
  HF_ENDPOINT   Hub mirror (default https://huggingface.co)
  NGC_KEY       NGC API key (required for ngc://)
  NGC_API_URL   NGC API (default https://api.ngc.nvidia.com)
  NGC_AUTH_URL  NGC token service (default https://authn.nvidia.com)
"""


def register(verbs: Any) -> None:
    pull = add_verb(verbs, "pull-model", help="download a pre-trained model into a directory, verified against "
                                              "the registry", epilog=_ENVIRONMENT)
    pull.add_argument("uri", metavar="URI", help=f"{HF_SHAPE} or {NGC_SHAPE}")
    pull.add_argument("--dest", required=True, metavar="D",
                      help="directory to hold the model's files; a rerun fetches only what is missing or wrong")
    pull.add_argument("--json", action="store_true", help="print the result as JSON")
    pull.set_defaults(run=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    from ..errors import TransferError
    from ..staging.pretrained import pull_model

    try:
        result = pull_model(args.uri, args.dest)
    except TransferError as exc:
        console.err(f"error: {exc}")
        return 1
    if args.json:
        console.json(result.to_dict())
    else:
        console.out(f"{result.uri} → {result.destination}: {result.describe()}")
    return 0
