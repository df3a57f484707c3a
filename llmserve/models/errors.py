"""What a model that cannot be served raises: torch-free, so that ``llmserve serve`` (no torch
in its process) can find a missing model (``store.resolve``) before it starts instances."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model file or folder is missing, truncated, corrupt or unsupported."""


class UnsupportedFamily(ModelLoadError):
    """The model is of a family (architecture) the decoder does not implement."""


class FlagError(ValueError):
    """A flag the engine cannot be built with, found only once the model is read (a KV budget
    under one block): its message starts with the flag; the CLI prints it in one line, exit 2."""
