"""The durable job record, kept after Kubernetes forgets the job.

* :mod:`.model` — the record document and its rules (schema, states, no credential values);
* :mod:`.store` — :class:`~.store.RecordStore`: open, mark, set_tier, update, get, list and the
  upload lock, the state machine written once over a storage backend;
* :mod:`.backend` — the storage interface; :mod:`.directory` (files under ``flock``, the
  default) and :mod:`.s3` (conditional writes, a state index, :mod:`.lease` for uploads);
* :mod:`.location` — which backend: ``root``, ``$TAO_DATA_IO_RECORDS``, the legacy
  ``$TAO_DATA_IO_JOBS_DIR`` or ``~/.tao-data-io/jobs``;
* :mod:`.from_request` — the record of a job request.

Callers import the public names from here: ``from tao_data_io.records import JobRecord, RecordStore``.
"""

from __future__ import annotations

from .backend import DEFAULT_LEASE_SECONDS
from .from_request import network_and_action, open_for
from .location import DEFAULT_ROOT, JOBS_DIR_VARIABLE, RECORDS_VARIABLE
from .model import (IDENTITY_FIELDS, SCHEMA_VERSION, STATES, STORAGE_TIERS, TERMINAL_STATES,
                            DamagedRecordError, JobRecord, OutputRoute, State, StorageTier, Transition,
                            check_state, check_tier)
from .store import RecordConflictError, RecordStore, Retry

__all__ = [
    "DEFAULT_LEASE_SECONDS", "DEFAULT_ROOT", "IDENTITY_FIELDS", "JOBS_DIR_VARIABLE", "RECORDS_VARIABLE",
    "SCHEMA_VERSION", "STATES", "STORAGE_TIERS", "TERMINAL_STATES", "DamagedRecordError", "JobRecord",
    "OutputRoute", "RecordConflictError", "RecordStore", "Retry", "State", "StorageTier", "Transition",
    "check_state", "check_tier", "network_and_action", "open_for",
]

