"""Sphinx configuration: furo, MyST Markdown, the API from the docstrings, the CLI from its parser."""

from __future__ import annotations

import importlib.metadata

project = "pgqueue"
author = "pgqueue contributors"
release = importlib.metadata.version("pgqueue-asyncio")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinxarg.ext",
    "sphinx_copybutton",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "screenshots/README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "pgqueue"

nitpicky = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
