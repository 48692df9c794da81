"""Sphinx configuration: furo, MyST Markdown, the reference generated from the code.

Build with ``nox -s docs`` (``sphinx-build -n -W``: every reference must
resolve and any warning fails the build). The build runs offline: the
inventories of other projects' documentation are local files (see
``intersphinx_mapping``), and the pages that describe the code are
generated from it by the extension in ``_ext/pgqueue_docs``.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

from pgqueue_docs.inventory import local_inventories  # noqa: E402
from sphinx.search.en import SearchEnglish  # noqa: E402

project = "pgqueue"
author = "the pgqueue maintainers"
project_copyright = f"2026, {author}"
release = importlib.metadata.version("pgqueue-asyncio")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx_copybutton",
    "pgqueue_docs",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "screenshots/README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Commands, flags and SQL are quoted as they are typed: no curly quotes,
# and ``--flag`` never turns into a dash.
smartquotes = False

html_theme = "furo"
html_title = "pgqueue"
# Output blocks (```text, captioned) are not commands: no copy button.
copybutton_selector = "div.highlight:not(.highlight-text) pre"

# Every reference must resolve (``-n``); the docstrings' `Name` is a Python
# cross-reference, as they are written.
nitpicky = True
default_role = "py:obj"

# -- The API from the docstrings ---------------------------------------------

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
# Types in the signature, which wraps one parameter a line when long.
autodoc_typehints = "signature"
python_maximum_signature_line_length = 88
# A name that links is shown without its module (``Job``, ``datetime``).
python_use_unqualified_type_names = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The type aliases as their names, documented on the reference pages (the
# annotations are strings: ``from __future__ import annotations``).
autodoc_type_aliases = {
    **{
        name: f"pgqueue.{name}"
        for name in (
            "Backoff",
            "Callback",
            "Connection",
            "Executor",
            "Handler",
            "Middleware",
            "SyncHandler",
        )
    },
    # The protocol a worker checks its ``connections`` against, which only
    # pgqueue.Connections fits (pgqueue._core.options sits below it).
    "SharedConnections": "pgqueue.Connections",
    # Private types that public signatures name, documented on the Types page.
    "HandlerDecorator": "pgqueue._jobtype.HandlerDecorator",
    # Names imported only for type checking, as the annotations write them.
    "datetime": "datetime.datetime",
    "timedelta": "datetime.timedelta",
    "TaskStatus": "anyio.abc.TaskStatus",
    "Span": "opentelemetry.trace.Span",
    "TracerProvider": "opentelemetry.trace.TracerProvider",
    "TextMapPropagator": "opentelemetry.propagators.textmap.TextMapPropagator",
    "CollectorRegistry": "prometheus_client.registry.CollectorRegistry",
    "Metric": "prometheus_client.metrics_core.Metric",
    "Starlette": "starlette.applications.Starlette",
    "AsyncSession": "sqlalchemy.ext.asyncio.AsyncSession",
    "AsyncConnection": "sqlalchemy.ext.asyncio.AsyncConnection",
    "Session": "sqlalchemy.orm.Session",
    "sa.Connection": "sqlalchemy.engine.Connection",
    "psycopg.Connection": "psycopg.Connection",
}
# TypeVars are private names of the modules that use them: a signature
# shows them, and there is nothing to link them to.
nitpick_ignore_regex = [("py:class", r"(pgqueue\.[\w.]+\.)?(C|H|P|R|PayloadT)")]

# -- Other projects' documentation, from local inventories --------------------

# Python's inventory comes from Debian's documentation package
# (python3.11-doc; .ci/run installs it), with links to that release's pages.
# Without the package, intersphinx fetches the published inventory (which
# needs a network: offline, the build then fails on it). Django's and
# SQLAlchemy's packages document 3.2 and 1.4, older than the extras need:
# their names are lists of inventories/ below, linking to 6.0 and 2.0.
DEBIAN = Path("/usr/share/doc")


def debian(package: str) -> str | None:
    """The inventory a Debian documentation package installs, if it is installed."""
    inventory = DEBIAN / package / "html" / "objects.inv"
    return str(inventory) if inventory.is_file() else None


intersphinx_mapping = {
    "python": ("https://docs.python.org/3.11/", debian("python3.11")),
    # asyncpg, AnyIO, Django, OpenTelemetry, prometheus_client, psycopg,
    # SQLAlchemy, Starlette and pytest: inventories/<name>.txt lists the names
    # these pages refer to and where each project's documentation describes
    # them, written into an objects.inv at each build.
    **local_inventories(DOCS / "inventories", DOCS / "_build" / "inventories"),
}


class Search(SearchEnglish):
    """English search that indexes the words pgqueue's options are named by.

    Sphinx drops English stop words from the index and from queries:
    "after" would find no page, not even the Workflows guide (``after=``).
    """

    stopwords = SearchEnglish.stopwords - {"after", "before", "until", "once"}


def setup(app: Any) -> None:
    """The search above; Django's ``setting`` objects (``:setting:`TASKS``` links to Django's page)."""
    app.add_search_language(Search)
    app.add_crossref_type("setting", "setting", indextemplate="pair: %s; setting")
