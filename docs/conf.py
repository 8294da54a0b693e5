"""Sphinx configuration of src_dask's documentation (``make docs``)."""

from __future__ import annotations

import src_dask

project = "src_dask"
author = "the src_dask developers"
release = version = src_dask.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
napoleon_numpy_docstring = True
napoleon_google_docstring = False
autodoc_typehints = "description"
autodoc_member_order = "bysource"
html_theme = "alabaster"
# links to the repository's own files outside docs/ (benchmarks, examples) are kept as
# written: they resolve on the repository's web view, not in the HTML build
suppress_warnings = ["myst.xref_missing"]
