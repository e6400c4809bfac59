"""The durable job record, kept after Kubernetes forgets the job.

* :mod:`.model` — the record document and its rules (schema, states, no credential values);
* :mod:`.store` — :class:`~.store.RecordStore`: open, mark, set_tier, update, get, list and the
  upload lock, the state machine written once over a storage backend;
* :mod:`.backend` — the storage interface; :mod:`.directory` (files under ``flock``, the
  default) and :mod:`.s3` (conditional writes, a state index, :mod:`.lease` for uploads);
* :mod:`.location` — which backend: ``root``, ``$TAO_DATA_IO_RECORDS``, the legacy
  ``$TAO_DATA_IO_JOBS_DIR`` or ``~/.tao-data-io/jobs``;
* :mod:`.from_request` — the record of a job request.

The public names are re-exported by :mod:`tao_data_io.record`, where callers import them.
"""
