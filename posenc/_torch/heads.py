"""The heads a tensor-parallel rank holds (not public)."""

from __future__ import annotations

from typing import Any

from posenc import _validate


def split_heads(num_heads: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous block of ``num_heads // world_size`` heads."""
    num_heads = _validate.check_int("num_heads", num_heads, minimum=1)
    world_size = _validate.check_int("world_size", world_size, minimum=1)
    rank = _validate.check_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
    if num_heads % world_size:
        raise ValueError(f"num_heads={num_heads} does not split evenly over world_size={world_size} ranks; use a "
                         f"tensor-parallel size that divides the head count, or pass head_range= explicitly")
    per = num_heads // world_size
    return rank * per, (rank + 1) * per


def module_head_range(num_heads: int, head_range: Any, tp_group: Any) -> tuple[int, int]:
    """A bias module's heads: ``head_range``, or this process's block in ``tp_group``, or all of them."""
    if tp_group is None:
        return _validate.check_head_range(num_heads, head_range)
    if head_range is not None:
        raise ValueError("pass head_range or tp_group, not both: the group decides this rank's heads")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("tp_group needs an initialised torch.distributed process group")
    rank = dist.get_rank(tp_group)
    if rank < 0:
        raise ValueError("this process is not a member of tp_group; build the module with the group it belongs to")
    return split_heads(num_heads, rank, dist.get_world_size(tp_group))
