"""The backend registry: a platform name (as a job record keeps it) and its settings → the backend.

Why a module above the backends: :mod:`tao_data_io.launch` defines the protocol every backend
implements, so it must not import the backends themselves (that was an import circle); the
callers that choose a backend — the CLI, the target blocks, a verb that rebuilds a recorded job's
backend — come here instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import UsageError
from .launch.backend import Backend


def backend_for(platform: str, config: Mapping[str, Any] | None = None) -> Backend:
    """The backend for ``platform`` (``local`` or ``kubernetes``), configured by ``config``
    (the target's settings: a workdir root, a namespace…)."""
    settings = dict(config or {})
    if platform == "local":
        from .local.backend import LocalBackend

        return LocalBackend(**settings)
    if platform == "kubernetes":
        from .kubernetes.backend import KubernetesBackend  # type: ignore[import-not-found]

        return KubernetesBackend(**settings)  # type: ignore[no-any-return]
    raise UsageError(f"platform {platform!r} is not a backend: use local or kubernetes")
