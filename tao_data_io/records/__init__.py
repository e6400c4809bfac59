"""The durable job record, kept after Kubernetes forgets the job.

* :mod:`.model` — the record document and its rules (schema, states, no credential values);
* :mod:`.store` — :class:`~.store.RecordStore`: open, mark, set_tier, update, get, list and the
  upload lock, the state machine written once over a storage;
* :mod:`.storage` — the storage interface; :mod:`.directory` (files under ``flock``, the
  default) and :mod:`.s3` (conditional writes, a state index, :mod:`.lease` for uploads);
* :mod:`.location` — which storage: ``root``, ``$TAO_DATA_IO_RECORDS``, the legacy
  ``$TAO_DATA_IO_JOBS_DIR`` or ``~/.tao-data-io/jobs``;
* :mod:`.from_request` — the record of a job request.

Callers import the public names from here: ``from tao_data_io.records import JobRecord, RecordStore``.
Each is loaded from its module when first asked for (PEP 562), so a command that only needs a
storage — an upload taking its lock and starting its listing before the model is built
(:mod:`tao_data_io.upload_head_start`) — does not pay for pydantic and the record's models
(~120 ms of a fresh process) before its first request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

# What a type checker reads instead of the lazy lookup below (tests/test_gates.py keeps the two alike).
if TYPE_CHECKING:
    from .storage import DEFAULT_LEASE_SECONDS as DEFAULT_LEASE_SECONDS
    from .storage import DamagedRecordError as DamagedRecordError
    from .from_request import network_and_action as network_and_action
    from .from_request import open_for as open_for
    from .location import DEFAULT_ROOT as DEFAULT_ROOT
    from .model import IDENTITY_FIELDS as IDENTITY_FIELDS
    from .model import SCHEMA_VERSION as SCHEMA_VERSION
    from .model import TERMINAL_STATES as TERMINAL_STATES
    from .model import JobRecord as JobRecord
    from .model import OutputRoute as OutputRoute
    from .model import Transition as Transition
    from .model import check_state as check_state
    from .model import check_tier as check_tier
    from .store import RecordConflictError as RecordConflictError
    from .store import RecordStore as RecordStore
    from .store import Retry as Retry
    from ..vocabulary import JOBS_DIR_VARIABLE as JOBS_DIR_VARIABLE
    from ..vocabulary import RECORDS_VARIABLE as RECORDS_VARIABLE
    from ..vocabulary import STATES as STATES
    from ..vocabulary import STORAGE_TIERS as STORAGE_TIERS
    from ..vocabulary import State as State
    from ..vocabulary import StorageTier as StorageTier

#: Each public name → the module of this package that defines it.
_HOMES = {
    "DEFAULT_LEASE_SECONDS": "storage", "DamagedRecordError": "storage",
    "network_and_action": "from_request", "open_for": "from_request",
    "DEFAULT_ROOT": "location", "JOBS_DIR_VARIABLE": "location", "RECORDS_VARIABLE": "location",
    **dict.fromkeys(("IDENTITY_FIELDS", "SCHEMA_VERSION", "STATES", "STORAGE_TIERS", "TERMINAL_STATES", "JobRecord",
                     "OutputRoute", "State", "StorageTier", "Transition", "check_state", "check_tier"), "model"),
    "RecordConflictError": "store", "RecordStore": "store", "Retry": "store",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
