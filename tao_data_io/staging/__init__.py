"""Staging a job's inputs: where each lives (:mod:`.layout`), the config materialized
(:mod:`.config`, over the spec walk of :mod:`tao_data_io.spec`), every input kind (:mod:`.selective`, :mod:`.archive`,
:mod:`.pretrained`), composed per input by :mod:`.stage` into the staging map (:mod:`.stage_map`)."""
