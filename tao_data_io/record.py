"""The job record API: ``from tao_data_io.record import JobRecord, RecordStore, ...``.

The code lives in the :mod:`tao_data_io.records` subpackage (the model, the store, its
directory and S3 backends); this module is where callers import it from.
"""

from __future__ import annotations

from .records.backend import DEFAULT_LEASE_SECONDS
from .records.from_request import network_and_action, open_for
from .records.location import DEFAULT_ROOT, JOBS_DIR_VARIABLE, RECORDS_VARIABLE
from .records.model import (IDENTITY_FIELDS, SCHEMA_VERSION, STATES, STORAGE_TIERS, TERMINAL_STATES,
                            DamagedRecordError, JobRecord, OutputRoute, State, StorageTier, Transition,
                            check_state, check_tier)
from .records.store import RecordConflictError, RecordStore, Retry

__all__ = [
    "DEFAULT_LEASE_SECONDS", "DEFAULT_ROOT", "IDENTITY_FIELDS", "JOBS_DIR_VARIABLE", "RECORDS_VARIABLE",
    "SCHEMA_VERSION", "STATES", "STORAGE_TIERS", "TERMINAL_STATES", "DamagedRecordError", "JobRecord",
    "OutputRoute", "RecordConflictError", "RecordStore", "Retry", "State", "StorageTier", "Transition",
    "check_state", "check_tier", "network_and_action", "open_for",
]
