"""The two ways the compat layer turns a message down: a pickle it will not read, and a request it
read safely but cannot serve. Both become ``OutputBatch(error=...)`` for the sglang client."""

from __future__ import annotations

import pickle


class RefusedPickle(pickle.UnpicklingError):
    """A payload the allow-list does not accept. Nothing in it was executed."""


class CompatError(ValueError):
    """A request that was read safely but cannot be served; the text goes to OutputBatch.error."""
