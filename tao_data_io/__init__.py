"""tao-data-io: get data to and from the compute container of NVIDIA TAO jobs.

The Prefect-free core. This module exports the verbs (a job's life, composed once), the runner
seam they run their steps through, the step API (what the verbs, the Prefect tasks and the
backends call), the contract models passed between steps, and the errors. Names resolve lazily
(PEP 562): ``import tao_data_io`` costs nothing, so a CLI verb pays only for what it uses.
"""

from __future__ import annotations

from .lazy import lazy_exports

#: public name → the module that owns it.
_EXPORTS: dict[str, str] = {
    # errors
    "TaoDataIOError": "errors", "UsageError": "errors", "CredentialError": "errors", "UnsafePathError": "errors",
    "TransferError": "errors", "IntegrityError": "errors", "BackendError": "errors", "is_retryable": "errors",
    # verbs and the runner seam
    "submit": "verbs", "collect": "verbs", "resync": "verbs", "cancel": "verbs", "Submitted": "verbs",
    "Collected": "verbs", "Canceled": "verbs", "Resynced": "verbs", "Runner": "runner", "direct": "runner",
    "VerifyFailed": "steps",
    # contract models
    "JobRequest": "request", "load_request": "request",
    "PlannedInput": "staging.layout", "StagedSource": "staging.stage_map", "StagingMap": "staging.stage_map",
    "read_staging_map": "staging.stage_map",
    "JobRecord": "records", "RecordStore": "records", "OutputRoute": "records", "open_for": "records",
    "TransferSummary": "transfer.summary", "Progress": "reporting", "Report": "reporting",
    # steps
    "plan_inputs": "staging.layout", "stage_input": "staging.stage", "stage_config": "staging.stage",
    "publish_map": "staging.stage",
    "stage": "staging.stage", "check_air_gap": "staging.stage", "materialize_config": "staging.config",
    "selective_download": "staging.selective", "extract_archive": "staging.archive", "pull_model": "staging.pretrained",
    "decide_route": "routing", "record_route": "routing", "upload_results": "outputs",
    "TransferEngine": "transfer.engine", "TransferOptions": "transfer.options",
    # helpers a step's caller needs
    "s3_credentials_from_env": "credentials", "forwarded_values": "credentials", "Redactor": "redaction",
    "throttled": "reporting",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
