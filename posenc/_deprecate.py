"""Old argument names that keep working for one release (not public).

A renamed keyword argument is accepted under its old name with a :class:`DeprecationWarning` that
names the new one; passing both raises.  The warning points at the user's line (the first frame
outside posenc, torch and keras, also through ``Module.__call__``).  Inside a traced graph
(``torch.compile``, ``torch.export``), which cannot hold a warning, the old name is accepted
silently.  Framework-free, so the torch and Keras sides share it.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

#: Marks "not passed" for an old keyword argument (None can be a meaningful value).
UNSET: Any = object()

_INTERNAL_PACKAGES = ("posenc", "torch", "keras")


def caller_stacklevel() -> int:
    """``stacklevel`` for a warning raised by the calling function that points at the first frame
    outside posenc, torch and keras: the user's line."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _INTERNAL_PACKAGES:
        frame = frame.f_back
        level += 1
    return level


def warn(message: str) -> None:
    """A ``DeprecationWarning`` at the user's line."""
    warnings.warn(message, DeprecationWarning, stacklevel=caller_stacklevel())


def renamed(where: str, old: str, new: str, old_value: Any, new_value: Any, default: Any, *,
            tracing: bool = False) -> Any:
    """The value of keyword ``new`` in a call of ``where``, also accepted under ``old`` for now.

    ``old_value`` is :data:`UNSET` when the old name was not passed; ``new_value`` equals
    ``default`` when the new name was not passed.  Warns when the old name was used (not while
    ``tracing``); raises ``TypeError`` when both were given.
    """
    if old_value is UNSET:
        return new_value
    if new_value is not default:
        raise TypeError(f"{where}: pass {new}= only ({old}= is its old name, deprecated)")
    if not tracing:
        warn(f"{where}: {old}= is deprecated and will be removed in the next release; pass {new}= instead")
    return old_value


def renamed_attribute(old: str, new: str) -> property:
    """A read-only property ``old`` that returns attribute ``new`` with a ``DeprecationWarning``."""
    def get(self: Any) -> Any:
        warn(f"{type(self).__name__}.{old} is deprecated and will be removed in the next release; read .{new}")
        return getattr(self, new)
    return property(get, doc=f"Old name of :attr:`{new}` (deprecated).")
