"""What a backend declares about itself, once, in its package: its settings model, where its
backend class is, what it needs installed, and how its target block is shown.

Why a declaration: the registry (:mod:`tao_data_io.backends`), the target blocks, the flows'
target parameter, the CLI and the job record all need to know the backends there are; each reads
this one object (``DECLARATION`` in the backend's package, or an entry point of the group
:data:`ENTRY_POINTS` for a backend from another distribution) instead of naming the backends
itself. Importing a declaration imports the settings model only: the backend class is imported
when one is built, so a backend that needs an extra (the ``kubernetes`` client) costs nothing to
a host that never builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tier import Capabilities
from .backend import BackendSettings

#: The entry-point group a distribution lists its backends in (each entry point a :class:`Declaration`).
ENTRY_POINTS = "tao_data_io.backends"


@dataclass(frozen=True)
class Declaration:
    """One backend, as everything above the seam knows it."""

    #: The backend's settings model; its ``name`` is the name records keep and users type.
    settings: type[BackendSettings]
    #: ``module:Class`` of the backend, built from the settings (imported only then).
    implementation: str
    #: The most the backend can do (its ``facts()`` may say less of the cluster at hand): what the
    #: tier decision reads, and what ``plan`` assumes without facts.
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: What a user is told to install when the backend's imports are missing (``None``: nothing extra).
    install: str | None = None
    #: Human words for the target block: ``TAO <title> Target``.
    title: str = ""
    #: The target block's description in the UI.
    summary: str = ""
    #: What the settings field holds, as the target block describes it.
    settings_summary: str = ""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def label(self) -> str:
        """The words people see for the backend: its title, else its name's words capitalized."""
        return self.title or " ".join(word.capitalize() for word in self.name.split("-"))

    @property
    def block_class(self) -> str:
        """The class name of the backend's target block: its label without spaces, ``Target`` after
        (``LocalTarget``); two backends whose labels differ only in spaces or case would share it."""
        return f"{self.label.replace(' ', '')}Target"
