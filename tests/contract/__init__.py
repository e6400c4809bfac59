"""The backends' conformance harnesses: :mod:`.harness` says what the suite
(``tests/test_backend_contract.py``) asks of a backend; each other module is one backend's adapter —
how to build its job, start it and drive it to each outcome (a real command in the local frame, the
Kubernetes stand-in's control plane, the fake's knobs). A new backend adds one module here and one
line to the suite's list, and gets every promise."""
