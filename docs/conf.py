"""Sphinx configuration of the pldlib guide (``make test`` builds it with warnings as errors)."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import gen_numbers  # noqa: E402

gen_numbers.main()  # the include files with numbers from results/ (docs/_generated/)

project = "pldlib"
author = "pldlib authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
napoleon_numpy_docstring = True
napoleon_google_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "undoc-members": False}
suppress_warnings = ["myst.header"]
html_theme = "alabaster"
html_title = "pldlib guide"
# the docstrings write "name : what it is" (a description, not a type), so no type cross-references
napoleon_use_param = False
napoleon_use_rtype = False
napoleon_preprocess_types = False
napoleon_use_ivar = True
