"""The launch seam: the plan a backend runs (:mod:`.plan`), the backend protocol and its small
results (:mod:`.backend`), and the verify probe both backends run inside the frame (:mod:`.probe`)."""
