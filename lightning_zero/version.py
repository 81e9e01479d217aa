"""lightning-zero's version, readable from a source tree as well as from an installed package (pyproject.toml takes
it from here)."""

__version__ = "0.1.0"
