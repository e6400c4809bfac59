"""The backend registry: a platform name (as a job record keeps it) and its settings → the backend.

Why a module above the backends: :mod:`tao_data_io.launch` defines the protocol every backend
implements and the settings base they share, so it must not import the backends themselves
(that was an import circle); the callers that choose a backend — the CLI, the target blocks, a
verb that rebuilds a recorded job's backend — come here instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import UsageError
from .kubernetes.settings import KubernetesSettings
from .launch.backend import Backend
from .local.settings import LocalSettings

PlatformSettings = LocalSettings | KubernetesSettings
#: Each platform's settings model, by the platform name a job record keeps.
SETTINGS: dict[str, type[PlatformSettings]] = {model.platform: model
                                               for model in (LocalSettings, KubernetesSettings)}
#: Settings renamed since job records began keeping them (platform → old name → new name). A
#: record written before a rename is migrated as it is read, so every verb still reaches its job.
RENAMED: dict[str, dict[str, str]] = {"local": {"workdir_root": "run_root"}}


def settings_model(platform: str) -> type[PlatformSettings]:
    """The settings model of ``platform``; a platform no backend has is refused, naming those there are."""
    model = SETTINGS.get(platform)
    if model is None:
        raise UsageError(f"platform {platform!r} is not a backend: use {' or '.join(SETTINGS)}")
    return model


def settings_from(platform: str, config: Mapping[str, Any] | None = None) -> PlatformSettings:
    """``platform``'s settings from ``config`` (a record's ``backend_config``, the CLI's flags), with
    renamed keys migrated (a new name given beside an old one wins: it is the later word); a
    refusal is a :class:`UsageError` naming the field, the value and the fix."""
    values = dict(config or {})
    for old, new in RENAMED.get(platform, {}).items():
        if old in values:
            values.setdefault(new, values.pop(old))
    return settings_model(platform).from_mapping(values)


def backend_for(platform: str, config: Mapping[str, Any] | None = None) -> Backend:
    """The backend of ``platform`` (``local`` or ``kubernetes``) built from ``config``: how a
    later verb rebuilds a recorded job's backend (``backend_config``), and how the CLI builds one."""
    return backend_from(settings_from(platform, config))


def backend_from(settings: PlatformSettings) -> Backend:
    """The backend these settings are for, built from them (how a target block builds its own).
    Each backend module is imported only here, when one is built: the Kubernetes backend needs
    the ``kubernetes`` extra, which a host that runs only local jobs need not have."""
    if isinstance(settings, LocalSettings):
        from .local.backend import LocalBackend

        return LocalBackend(settings)
    from .kubernetes.backend import KubernetesBackend

    return KubernetesBackend(settings)
