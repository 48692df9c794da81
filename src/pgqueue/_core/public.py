"""What ``dir()`` of a public package lists: its public names, not its plumbing."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["public_names"]


def public_names(namespace: dict[str, Any], names: Iterable[str]) -> list[str]:
    """Return ``names`` and the package's public submodules imported so far, sorted.

    A package's private modules (``_worker``), the ``annotations`` of
    ``from __future__ import annotations`` and modules it imported (``sys``)
    are left out.
    """
    package = namespace["__name__"]
    submodules = [
        name
        for name, value in namespace.items()
        if isinstance(value, ModuleType)
        and not name.startswith("_")
        and value.__name__ == f"{package}.{name}"
    ]
    return sorted({*names, *submodules})
