"""plait's cross entropy gives torch's values and gradients while keeping no fp32 copy of the logits,
on one rank and on logits split by vocabulary over tensor-parallel ranks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from plait.parallel.cross_entropy import BLOCK_ELEMENTS, cross_entropy

VOCAB = 96


def _logits(dtype: torch.dtype, rows: int = 2, tokens: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, tokens, VOCAB, generator=generator) * 3).to(dtype)
    return logits, torch.randint(0, VOCAB, (rows, tokens), generator=generator)


def _torch_loss_and_gradient(logits: torch.Tensor, targets: torch.Tensor, divisor: int = 1):
    leaf = logits.detach().requires_grad_()
    loss = F.cross_entropy(leaf.flatten(0, 1).float(), targets.flatten()) / divisor
    loss.backward()
    return loss.detach(), leaf.grad


def _plait_loss_and_gradient(logits: torch.Tensor, targets: torch.Tensor, divisor: int = 1, z_loss: float = 0.0):
    leaf = logits.detach().requires_grad_()
    loss = cross_entropy(leaf, targets, divisor, z_loss)
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_values_and_gradients_are_torchs(dtype):
    logits, targets = _logits(dtype)
    expected, expected_grad = _torch_loss_and_gradient(logits, targets, 3)
    loss, grad = _plait_loss_and_gradient(logits, targets, 3)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    tolerance = 1e-7 if dtype == torch.float32 else 1e-3  # bf16: the gradient rounded once, to its dtype
    assert torch.allclose(grad.float(), expected_grad.float(), atol=tolerance, rtol=0)


def test_z_loss_adds_the_mean_squared_log_sum_exp_and_its_gradient():
    logits, targets = _logits(torch.float32)
    leaf = logits.detach().requires_grad_()
    flat = leaf.flatten(0, 1)
    z_term = 0.1 * flat.logsumexp(dim=-1).square().mean()
    ((F.cross_entropy(flat, targets.flatten()) + z_term) / 3).backward()
    loss, grad = _plait_loss_and_gradient(logits, targets, 3, z_loss=0.1)
    plain_loss, plain_grad = _plait_loss_and_gradient(logits, targets, 3)
    assert loss.item() == pytest.approx(plain_loss.item() + z_term.item() / 3, rel=1e-6)
    assert torch.allclose(grad, leaf.grad, atol=1e-7, rtol=0)
    assert not torch.allclose(grad, plain_grad, atol=1e-4, rtol=0)


def test_rows_read_a_block_at_a_time_give_the_same_values(monkeypatch):
    logits, targets = _logits(torch.float32, rows=4, tokens=7)
    whole = _plait_loss_and_gradient(logits, targets)
    monkeypatch.setattr("plait.parallel.cross_entropy.BLOCK_ELEMENTS", 3 * VOCAB)  # blocks of three rows
    blocked = _plait_loss_and_gradient(logits, targets)
    assert BLOCK_ELEMENTS > logits.numel()
    assert blocked[0].item() == pytest.approx(whole[0].item(), rel=1e-7)
    assert torch.allclose(blocked[1], whole[1], atol=1e-9, rtol=0)


def test_masked_padding_columns_take_no_probability():
    logits, targets = _logits(torch.float32)
    padded = torch.cat([logits, torch.full((*logits.shape[:2], 8), -torch.inf)], dim=-1)
    loss, grad = _plait_loss_and_gradient(padded, targets)
    assert loss.item() == pytest.approx(_torch_loss_and_gradient(logits, targets)[0].item(), rel=1e-6)
    assert torch.all(grad[..., VOCAB:] == 0)


def test_the_loss_keeps_only_its_gradient_in_the_logits_dtype():
    """torch's loss keeps fp32 log-probabilities of bf16 logits for its backward (twice their bytes);
    plait's keeps one bf16 tensor of their width."""
    logits, targets = _logits(torch.bfloat16)

    def saved_bytes(loss_of) -> int:
        saved = []
        leaf = logits.detach().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.nbytes) or t, lambda t: t):
            loss_of(leaf)
        return sum(saved)

    torch_saved = saved_bytes(lambda x: F.cross_entropy(x.flatten(0, 1).float(), targets.flatten()))
    plait_saved = saved_bytes(lambda x: cross_entropy(x, targets))
    assert plait_saved == logits.numel() * 2
    assert torch_saved >= logits.numel() * 4


def vocab_parallel_loss_and_gradient(dtype_name: str, z_loss: float) -> tuple[float, torch.Tensor]:
    """On each tp rank: the loss of logits split by vocabulary (a DTensor), and this rank's gradient."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    logits, targets = _logits(getattr(torch, dtype_name))
    sharded = distribute_tensor(logits, mesh, [Shard(-1)]).requires_grad_()
    loss = cross_entropy(sharded, targets, 3, z_loss)
    loss.backward()
    return loss.item(), sharded.grad.full_tensor()


@pytest.mark.parametrize("dtype, z_loss", (("float32", 0.0), ("bfloat16", 0.0), ("float32", 0.1)))
def test_logits_split_by_vocabulary_give_the_whole_vocabularys_loss(pool, dtype, z_loss):
    logits, targets = _logits(getattr(torch, dtype))
    expected, expected_grad = _plait_loss_and_gradient(logits, targets, 3, z_loss)
    for loss, grad in pool.run(vocab_parallel_loss_and_gradient, 4, dtype, z_loss):
        assert loss == pytest.approx(expected.item(), rel=1e-6)
        assert torch.allclose(grad.float(), expected_grad.float(), atol=1e-7 if dtype == "float32" else 1e-3, rtol=0)
