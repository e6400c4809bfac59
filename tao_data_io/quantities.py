"""Kubernetes quantities: the one reading of the sizes a job request declares (binary, ``16Gi``:
``/dev/shm``, memory, node-local disk, the results limit) and of its CPU count (``8``, ``7.5``,
``7500m``).

Why a module of its own: the request validates them, but the paths that only size things — an
upload holding a job to its results limit, the local frame sizing its tmpfs, a renderer — need
the arithmetic, not the request model; importing that model for it cost every scheduled resync
16–23 ms (``bench/README.md``, the start-up paths).
"""

from __future__ import annotations

import re

#: A Kubernetes binary quantity such as ``16Gi`` (what ``/dev/shm`` sizes are written in).
_BINARY_QUANTITY = re.compile(r"[1-9][0-9]{0,5}(Ki|Mi|Gi|Ti)")
_FACTORS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
#: A Kubernetes CPU quantity: whole or decimal cores, or millicores.
_CPU_QUANTITY = re.compile(r"[1-9][0-9]{0,5}m|[1-9][0-9]{0,3}|[0-9]{1,3}\.[0-9]{1,3}")


def is_binary_quantity(value: str) -> bool:
    return bool(_BINARY_QUANTITY.fullmatch(value))


def quantity_bytes(quantity: str) -> int:
    """``16Gi`` → 17179869184 (the quantity was validated: :func:`is_binary_quantity`)."""
    return int(quantity[:-2]) * _FACTORS[quantity[-2:]]


def checked_quantity(value: object, field: str, *, least: str | None = None, most: str | None = None,
                     beyond: str = "", example: str = "16Gi") -> str:
    """``value`` if it is a binary quantity from ``least`` to ``most`` (each optional); else a
    ``ValueError`` naming ``field``, the value and the fix (``beyond``: why ``most`` is the most).
    The one check of every size a request, a target or a setting gives."""
    if not isinstance(value, str) or not is_binary_quantity(value):
        raise ValueError(f"{field} {value!r} is not a binary quantity: write a whole number with Ki, Mi, Gi or Ti, "
                         f"such as {example}")
    if least is not None and quantity_bytes(value) < quantity_bytes(least):
        raise ValueError(f"{field} {value!r} is less than {least}, the least it may be: raise it")
    if most is not None and quantity_bytes(value) > quantity_bytes(most):
        raise ValueError(f"{field} {value!r} is more than {most}{beyond}: give less")
    return value


def is_cpu_quantity(value: str) -> bool:
    return bool(_CPU_QUANTITY.fullmatch(value))


def cpu_millicores(quantity: str) -> int:
    """``500m`` → 500, ``2`` → 2000, ``0.5`` → 500: a validated CPU quantity
    (:func:`is_cpu_quantity`) in thousandths of a core, as Kubernetes counts it (a fraction
    finer than a millicore is rounded up, as Kubernetes rounds it)."""
    if quantity.endswith("m"):
        return int(quantity[:-1])
    whole, _, fraction = quantity.partition(".")
    return int(whole) * 1000 + int((fraction + "000")[:3])
