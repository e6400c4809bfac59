"""The launch seam: the plan a backend runs (:mod:`.plan`), the backend protocol and its small
results (:mod:`.backend`), the verify probe both backends run inside the frame (:mod:`.probe`),
and the rendezvous variables both give each rank of a multi-node job (:mod:`.rendezvous`)."""
