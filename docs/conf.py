"""Sphinx configuration of xlakern's API reference (``make docs``; warnings are errors)."""

from xlakern import __version__

project = "xlakern"
author = "xlakern developers"
copyright = "xlakern developers, Apache-2.0"
release = version = __version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"  # types beside each parameter, signatures stay readable
napoleon_google_docstring = True
napoleon_numpy_docstring = False
exclude_patterns = ["_build"]
html_theme = "alabaster"
