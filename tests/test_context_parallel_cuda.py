"""Ring attention with posenc's RoPE: torch's ``context_parallel`` on two CUDA GPUs (NCCL).

Each rank holds its shard of q, k, v and of a positions buffer (sharded by torch with its head-tail load
balancer), rotates q and k with posenc at those positions, and calls SDPA, which torch turns into ring
attention; the unsharded output (``context_parallel_unshard``) must equal plain causal SDPA of the whole
sequence rotated at once.  Needs two GPUs: skipped otherwise (``scripts/gpu_check.sh`` runs it)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch

import posenc
from posenc.distributed import shard_positions

if torch.cuda.device_count() < 2:
    pytest.skip("ring attention needs two CUDA GPUs", allow_module_level=True)
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_nccl_available():
    pytest.skip("torch.distributed with NCCL is not available", allow_module_level=True)

WORLD = 2
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _worker(rank: int, store: str, result_dir: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cuda", (WORLD,))
        rope = posenc.RotaryEmbedding(64, max_seq_len=4096, scaling=posenc.YarnScaling(4.0, 1024), device="cuda")
        checks = 0
        for dtype in TOLERANCE:
            for seq_len in (256, 1024):
                g = torch.Generator(device="cuda").manual_seed(seq_len)
                q, k, v = (torch.randn(2, 8, seq_len, 64, device="cuda", dtype=dtype, generator=g) for _ in range(3))
                positions = torch.arange(seq_len, device="cuda")[None].expand(2, -1).contiguous()
                rq, rk = rope(q, k, positions=positions, seq_len=seq_len)
                want = F.scaled_dot_product_attention(rq, rk, v, is_causal=True)
                with context_parallel(mesh, buffers=[q, k, v, positions], buffer_seq_dims=[2, 2, 2, 1]):
                    sq, sk = rope(q, k, positions=positions, seq_len=seq_len)
                    out = F.scaled_dot_product_attention(sq, sk, v, is_causal=True)
                    expected = shard_positions(seq_len, rank, WORLD, device="cuda")
                    assert torch.equal(positions[0], expected), (positions[0], expected)
                got = context_parallel_unshard(mesh, [out], [2])[0]
                torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE[dtype])
                checks += 1
        with open(os.path.join(result_dir, f"rank{rank}.done"), "w") as f:
            f.write(str(checks))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ring_attention_with_posenc_rope_equals_the_unsharded_attention(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True,
                       start_method="spawn")
    assert [(tmp_path / f"rank{r}.done").read_text() for r in range(WORLD)] == ["4"] * WORLD
