"""Pre-trained models from the Hugging Face Hub or NGC: pull (verify, publish), and one client per
registry. See :mod:`.pull`."""

from .pull import MARKER_NAME, PullResult, pull_model, registry_for

__all__ = ["MARKER_NAME", "PullResult", "pull_model", "registry_for"]
