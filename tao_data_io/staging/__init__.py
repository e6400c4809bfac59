"""Staging a job's inputs: where each lives (:mod:`.layout`), the spec walked and the config
materialized (:mod:`.spec`, :mod:`.config`), every input kind (:mod:`.selective`, :mod:`.archive`,
:mod:`.pretrained`), composed per input by :mod:`.stage` into the staging map (:mod:`.stage_map`)."""
