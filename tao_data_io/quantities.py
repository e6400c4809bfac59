"""Kubernetes binary quantities (``16Gi``): the one reading of the sizes a job request declares
(``/dev/shm``, memory, node-local disk, the results limit).

Why a module of its own: the request validates them, but the paths that only size things — an
upload holding a job to its results limit, the local frame sizing its tmpfs, a renderer — need
the arithmetic, not the request model; importing that model for it is ~15 ms of pydantic class
building in every scheduled resync.
"""

from __future__ import annotations

import re

#: A Kubernetes binary quantity such as ``16Gi`` (what ``/dev/shm`` sizes are written in).
_BINARY_QUANTITY = re.compile(r"[1-9][0-9]{0,5}(Ki|Mi|Gi|Ti)")
_FACTORS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}


def is_binary_quantity(value: str) -> bool:
    return bool(_BINARY_QUANTITY.fullmatch(value))


def quantity_bytes(quantity: str) -> int:
    """``16Gi`` → 17179869184 (the quantity was validated: :func:`is_binary_quantity`)."""
    return int(quantity[:-2]) * _FACTORS[quantity[-2:]]
