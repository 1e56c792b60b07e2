"""A byte-level corpus from the source of Python's own standard library (no download, no data files).

Files are the ``*.py`` files under ``sysconfig.get_paths()["stdlib"]``, sorted by relative path,
excluding ``site-packages`` and test suites (``test``/``tests``/``idlelib/idle_test`` folders).  Each
file goes to validation when ``crc32(relative path) % 10 == 0``, else to training: a split by file,
stable across runs and machines with the same Python version.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sysconfig
import zlib

import torch

__all__ = ["Corpus", "stdlib_corpus"]

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Training and validation bytes as uint8 tensors, and the files they came from."""

    train: torch.Tensor
    valid: torch.Tensor
    train_files: tuple[str, ...]
    valid_files: tuple[str, ...]


def stdlib_files(root: pathlib.Path | None = None) -> list[tuple[str, pathlib.Path]]:
    """``(relative path, path)`` of the standard library's ``.py`` files, sorted."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"]) if root is None else pathlib.Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library folder {root} does not exist")
    out = []
    for folder, dirs, files in os.walk(root):           # symlinked folders are not followed
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]  # prune: site-packages can hold most of the tree
        for name in files:
            if name.endswith(".py"):
                path = pathlib.Path(folder, name)
                out.append((path.relative_to(root).as_posix(), path))
    out.sort()
    return out


def stdlib_corpus(*, max_bytes: int | None = None, root: pathlib.Path | None = None) -> Corpus:
    """Build the corpus; ``max_bytes`` caps each split (taking files in sorted order)."""
    train: list[bytes] = []
    valid: list[bytes] = []
    tf: list[str] = []
    vf: list[str] = []
    sizes = {"train": 0, "valid": 0}
    for rel, path in stdlib_files(root):
        split = "valid" if zlib.crc32(rel.encode()) % 10 == 0 else "train"
        if max_bytes is not None and sizes[split] >= max_bytes:
            continue
        data = path.read_bytes()
        (valid if split == "valid" else train).append(data)
        (vf if split == "valid" else tf).append(rel)
        sizes[split] += len(data)
    def join(chunks: list[bytes]) -> torch.Tensor:
        blob = b"".join(chunks)
        if max_bytes is not None:
            blob = blob[:max_bytes]
        return torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone()
    if not train or not valid:
        raise ValueError("the standard library yielded no training or no validation files")
    return Corpus(join(train), join(valid), tuple(tf), tuple(vf))
