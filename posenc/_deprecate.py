"""Old argument names that keep working for one release (not public).

A renamed keyword argument is accepted under its old name with a :class:`DeprecationWarning` that
names the new one; passing both raises.  Framework-free, so the torch and Keras sides share it.
"""

from __future__ import annotations

import warnings
from typing import Any

#: Marks "not passed" for an old keyword argument (None can be a meaningful value).
UNSET: Any = object()


def renamed(where: str, old: str, new: str, old_value: Any, new_value: Any, default: Any, *, stacklevel: int = 3) -> Any:
    """The value of keyword ``new`` in a call of ``where``, also accepted under ``old`` for now.

    ``old_value`` is :data:`UNSET` when the old name was not passed; ``new_value`` equals
    ``default`` when the new name was not passed.  Warns (``DeprecationWarning``, attributed to the
    caller of ``where``; ``stacklevel`` counts from this function) when the old name was used;
    raises ``TypeError`` when both were given.
    """
    if old_value is UNSET:
        return new_value
    if new_value is not default:
        raise TypeError(f"{where}: pass {new}= only ({old}= is its old name, deprecated)")
    warnings.warn(
        f"{where}: {old}= is deprecated and will be removed in the next release; pass {new}= instead",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return old_value
