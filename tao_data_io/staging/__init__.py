"""Staging a job's inputs: where each lives (:mod:`.layout`, over the placement rule of
:mod:`tao_data_io.frame`), the config materialized (:mod:`.config`, over the spec walk of
:mod:`tao_data_io.spec`), each input staged by its kind (:mod:`.inputs`: :mod:`.selective`,
:mod:`.archive`, :mod:`.pretrained`, the transfer engine) with one engine per run
(:mod:`.engines`), into a job's staging root or the shared stage cache (:mod:`.cache`), composed
by :mod:`.stage` into the staging map (:mod:`.stage_map`)."""
