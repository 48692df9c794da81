"""Write intersphinx inventories (``objects.inv``) from plain lists of names.

For projects whose published inventory the build cannot read (it runs
offline) and which no local package provides. A list (``docs/inventories/
<key>.txt``) names the project and the address of its documentation, then
each object the pages refer to and where that documentation describes it::

    project: asyncpg
    url: https://magicstack.github.io/asyncpg/current/
    asyncpg.Pool  py:class  api/index.html#asyncpg.pool.Pool

The file written is Sphinx's inventory format, version 2: four header
lines, then ``name domain:role priority address display-name`` lines,
compressed with zlib.
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Listing", "local_inventories", "read_listing", "write_inventory"]


class Listing(NamedTuple):
    """A list of names: the project, its documentation's address, its entries."""

    project: str
    url: str
    entries: list[tuple[str, str, str]]
    """``(name, domain:role, address relative to url)`` of each object."""


def read_listing(path: Path) -> Listing:
    """Read the list at ``path``.

    Blank lines and lines starting with ``#`` are skipped (an address holds
    a ``#``, so a comment takes a line of its own).
    """
    headers: dict[str, str] = {}
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, colon, value = line.partition(": ")
        if colon and key in ("project", "url"):
            headers[key] = value.strip()
            continue
        fields = line.split()
        if len(fields) != 3 or ":" not in fields[1]:
            msg = f"{path}:{number}: expected 'name domain:role address', got {line!r}"
            raise ValueError(msg)
        entries.append((fields[0], fields[1], fields[2]))
    missing = {"project", "url"} - set(headers)
    if missing:
        msg = f"{path}: no {' and no '.join(sorted(missing))} line"
        raise ValueError(msg)
    return Listing(headers["project"], headers["url"], entries)


def write_inventory(listing: Listing, target: Path) -> Path:
    """Write the inventory of ``listing`` to ``target``; return ``target``.

    The file is replaced atomically, so builds running side by side never
    read half of one.
    """
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {listing.project}\n"
        "# Version: \n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = "".join(
        f"{name} {role} 1 {address} -\n" for name, role, address in listing.entries
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_bytes(header.encode() + zlib.compress(body.encode(), 9))
    partial.replace(target)
    return target


def local_inventories(lists: Path, target: Path) -> dict[str, tuple[str, str]]:
    """``intersphinx_mapping`` entries for each list in ``lists``, written to ``target``.

    Each list ``<key>.txt`` becomes ``<target>/<key>.inv``, mapped under
    ``<key>`` to its project's address.
    """
    mapping = {}
    for path in sorted(lists.glob("*.txt")):
        listing = read_listing(path)
        inventory = write_inventory(listing, target / f"{path.stem}.inv")
        mapping[path.stem] = (listing.url, str(inventory))
    return mapping
