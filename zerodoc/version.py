"""The version of zerodoc: the one place it is defined (pyproject.toml reads it from here).

Imports nothing, so every layer can import it without reaching up to the package root."""

__version__ = "0.1.0"
