"""The distribution's version, below every room so any of them may name it."""

__version__ = "0.1.0"
