"""Patch state: the records a patched module carries (plain data, picklable and copyable), a verified
change (:class:`_Plan`) and how it is applied and undone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from posenc.integrations.transformers._common import _PATCH, Route
from posenc.integrations.transformers._stand_in import _install_fast, _uninstall_fast

# ---- patch records: plain data on each patched module, picklable and copyable ---------------------------

class _Patch:
    """What :func:`patch_model` changed on one module: the instance attributes it replaced (with
    their old values, or none) and the name of the submodule it registered."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.saved: list[tuple[str, bool, Any]] = []
        self.submodule: str | None = None

    def __repr__(self) -> str:
        return f"posenc patch ({self.kind})"


class _Call:
    """``owner.<name>(...)`` replaced by ``fn(owner, ...)``: a module-level function and its owner,
    so that the replacement pickles (by the function's name) and copies (with its owner)."""

    def __init__(self, owner: torch.nn.Module, fn: Callable[..., Any]) -> None:
        self.owner, self.fn = owner, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self.owner, *args, **kwargs)


class _Plan:
    """A verified change to one module, applied only once every module of the model is verified."""

    def __init__(self, module: torch.nn.Module, kind: str, methods: dict[str, Callable[..., Any]],
                 submodule: tuple[str, torch.nn.Module] | None = None, note: str = "") -> None:
        self.module, self.kind, self.methods, self.submodule, self.note = module, kind, methods, submodule, note
        self.fast: Route | None = None

    def apply(self) -> None:
        record = _Patch(self.kind)
        if self.fast is not None and self.submodule is not None:
            _install_fast(self.fast.module, self.fast.function, self.submodule[1])
        if self.submodule is not None:
            name, sub = self.submodule
            self.module.add_module(name, sub)
            record.submodule = name
        for name, value in self.methods.items():
            had = name in vars(self.module)
            record.saved.append((name, had, vars(self.module).get(name)))
            object.__setattr__(self.module, name, value)
        object.__setattr__(self.module, _PATCH, record)


def _unpatch_module(module: torch.nn.Module) -> None:
    record = vars(module).pop(_PATCH, None)
    if record is None:
        return
    for name, had, old in reversed(record.saved):
        if had:
            object.__setattr__(module, name, old)
        else:
            vars(module).pop(name, None)
    if record.submodule is not None:
        sub = module._modules.pop(record.submodule, None)
        fast = getattr(sub, "fast", None)
        if fast is not None and sub is not None:
            _uninstall_fast(fast.module, fast.function, sub)


def _is_patched(module: torch.nn.Module) -> bool:
    return _PATCH in vars(module)
