"""Ring context parallelism (``--cp-algorithm ring``): the blockwise math equals one attention kernel,
and training under it gives the single-process losses, step for step, for both model families."""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from plait.errors import ConfigError
from plait.facts.stack import STACKS
from plait.facts.validity import fit_problems
from plait.layout import ZIGZAG_ALGORITHMS, Layout
from plait.models.spec import ModelSpec, model_spec
from plait.models.transformer import expand_kv_heads
from plait.parallel.ring_attention import ring_backward, ring_forward, zigzag_positions
from plait.hardware import hardware
from plait.plan.scan import scan
from plait.plan.workload import Workload
from plait.plan.space import scanned_layout
from tests.cases import layout_world_size, run_config, train_losses
from tests.test_data_parallel_parity import assert_same_losses

RING = {"cp_algorithm": "ring"}
LAYOUTS = [
    {"cp": 2},
    {"cp": 4},
    {"cp": 4, "tp": 2},  # cp 4 over 2 heads a tensor-parallel rank: beyond what the all-to-all can split
    {"cp": 2, "tp": 2, "sp": True},
    {"cp": 2, "recompute": "selective"},  # the recomputed core passes K/V round the ring again
    {"cp": 2, "recompute": "full"},
]
BF16_TOLERANCE = 0.02  # tests/test_training.py: bf16 stays within 2% of fp32


class ThreadRing:
    """``plait.parallel.ring_communications.Ring`` for threads of one process: the n-th ``pass_on`` of a
    rank pairs with the n-th of its neighbours, as every rank of a real ring calls it in the same order."""

    def __init__(self, rank: int, size: int, mailboxes: list[list[queue.Queue]]):
        self.rank, self.size, self.mailboxes, self.calls = rank, size, mailboxes, 0

    def pass_on(self, tensor: torch.Tensor):
        index, self.calls = self.calls, self.calls + 1
        self.mailboxes[(self.rank + 1) % self.size][index].put(tensor.clone())
        mailbox = self.mailboxes[self.rank][index]
        return type("Pending", (), {"wait": lambda _: mailbox.get(timeout=30)})()


def _ring_step(q, k, v, grad_out, rank: int, size: int, mailboxes) -> tuple[torch.Tensor, ...]:
    """Forward and backward of one rank's zig-zag share through ``ring_forward`` and ``ring_backward``."""
    ring = ThreadRing(rank, size, mailboxes)
    mine = zigzag_positions(q.shape[2], rank, size)
    local = [t[:, :, mine] for t in (q, k, v, grad_out)]
    out, lse = ring_forward(*local[:3], ring)
    return (mine, out, *ring_backward(local[3], *local[:3], out, lse, ring))


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_blockwise_ring_attention_equals_one_causal_kernel(cp, heads, kv_heads):
    """Output and the gradients of q, k, v of every rank's blocks, merged by log-sum-exp, equal
    scaled_dot_product_attention over the whole sequence: the reference in fp64, the ring within the
    rounding of its fp32 statistics (a wrong merge or mask is off by the size of an attention weight)."""
    generator = torch.Generator().manual_seed(cp)
    batch, seq, dim = 2, 24, 8
    q = torch.randn(batch, heads, seq, dim, generator=generator, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(batch, kv_heads, seq, dim, generator=generator, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    grad_out = torch.randn(batch, heads, seq, dim, generator=generator, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, *expand_kv_heads(q, k, v), is_causal=True)
    expected.backward(grad_out)

    mailboxes = [[queue.Queue() for _ in range(4 * cp)] for _ in range(cp)]
    with ThreadPoolExecutor(cp) as threads:
        ranks = list(threads.map(lambda r: _ring_step(q.detach(), k.detach(), v.detach(), grad_out, r, cp, mailboxes),
                                 range(cp)))
    got = {name: torch.zeros_like(t) for name, t in (("out", q), ("q", q), ("k", k), ("v", v))}
    for mine, out, grad_q, grad_k, grad_v in ranks:
        for name, value in (("out", out), ("q", grad_q), ("k", grad_k), ("v", grad_v)):
            got[name][:, :, mine] = value
    torch.testing.assert_close(got["out"], expected.detach(), rtol=1e-5, atol=1e-5)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close(got[name], tensor.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"d{name}: {m}")


def test_zigzag_shards_cover_the_sequence_once_with_equal_causal_work():
    cp, seq = 4, 32
    shards = [zigzag_positions(seq, rank, cp) for rank in range(cp)]
    assert sorted(torch.cat(shards).tolist()) == list(range(seq))
    assert len({int((shard + 1).sum()) for shard in shards}) == 1  # keys each rank's queries see, in all


@pytest.fixture(scope="module")
def single_process(pool):
    return {model: pool.run(train_losses, 1, run_config(model))[0] for model in ("tiny", "tiny-llama")}


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(f"{k}{v}" for k, v in layout.items()))
def test_ring_layout_matches_single_process(pool, single_process, model, layout):
    reference = single_process[model]
    for losses in pool.run(train_losses, layout_world_size(layout), run_config(model, **layout, **RING)):
        assert_same_losses(reference, losses)


def assert_bf16_cp2_within_rounding(pool, algorithm: str) -> None:
    """bf16 training on cp 2 under ``algorithm`` learns and stays within bf16 rounding of one process."""
    single = pool.run(train_losses, 1, run_config("tiny-llama", precision="bf16"))[0]
    for losses in pool.run(train_losses, 2, run_config("tiny-llama", precision="bf16", cp=2, cp_algorithm=algorithm)):
        assert losses[-1] < losses[0]
        for a, b in zip(single, losses):
            assert abs(a - b) < BF16_TOLERANCE * a


def test_bf16_ring_stays_within_bf16_rounding_of_the_single_process(pool):
    assert_bf16_cp2_within_rounding(pool, "ring")


def test_checkpoint_of_ring_resumes_under_all_to_all_and_one_process(pool, tmp_path):
    """Ring and all-to-all hold the same weights, only the tokens differ: a ring checkpoint continues
    the uninterrupted run's losses under the head exchange and on one process."""
    straight = pool.run(train_losses, 1, run_config("tiny-llama", steps=4))[0]
    saved = str(tmp_path / "saved")
    first_half = run_config("tiny-llama", steps=2, cp=2, **RING)
    pool.run(train_losses, 2, replace(first_half, train=replace(first_half.train, checkpoint_every=2)), saved)
    for layout in ({"cp": 2}, {}):
        config = run_config("tiny-llama", steps=4, **layout)
        resumed = pool.run(train_losses, layout_world_size(layout), replace(config, train=replace(config.train, resume=True)),
                           saved)
        assert_same_losses(straight[2:], resumed[0])


# ---------------------------------------------------------------- one choice, read by train and plan

def test_the_layout_carries_the_algorithm_and_names_it_only_when_it_runs():
    assert Layout(cp=2, cp_algorithm="ring").describe() == "cp2 (ring)"
    assert Layout(cp_algorithm="ring").describe() == Layout(cp=2).describe().replace("cp2", "single")
    with pytest.raises(ConfigError, match="unknown context-parallel algorithm 'rings'; use one of all-to-all, ring, all-gather"):
        Layout(cp=2, cp_algorithm="rings").validate()


def test_each_algorithm_has_its_fit_rule_and_a_stack_refuses_what_it_lacks():
    spec = model_spec("tiny-llama", seq_len=64)  # 4 heads, 2 kv-heads
    assert fit_problems(spec, Layout(tp=2, cp=4, cp_algorithm="ring")) == []
    assert "or --cp-algorithm ring" in fit_problems(spec, Layout(tp=2, cp=4))[0]
    assert "not divisible by 2 × --cp 3" in fit_problems(spec, Layout(cp=3, cp_algorithm="ring"))[0]
    assert fit_problems(spec, Layout(cp=2, cp_algorithm="ring"), STACKS["megatron"]) == []
    refused = fit_problems(spec, Layout(cp=2), STACKS["megatron"])
    assert refused == ["this software stack runs context parallelism only as ring, not all-to-all; "
                       "pass --cp-algorithm ring"]


def test_train_reads_the_flag_and_the_config_file(tmp_path):
    from plait.cli import build_parser
    from plait.config import config_from_args

    flags = ["train", "--model", "tiny-llama", "--seq-len", "64", "--global-batch", "8", "--precision", "fp32"]
    config = config_from_args(build_parser().parse_args([*flags, "--tp", "2", "--cp", "4", "--cp-algorithm", "ring"]))
    assert config.layout == Layout(tp=2, cp=4, cp_algorithm="ring")
    (tmp_path / "run.toml").write_text('[layout]\ncp = 2\ncp_algorithm = "ring"\n')
    config = config_from_args(build_parser().parse_args([*flags, "--config", str(tmp_path / "run.toml")]))
    assert config.layout == Layout(cp=2, cp_algorithm="ring")


def _algorithms(fixed: dict, stack: str = "plait") -> set[str]:
    spec = ModelSpec("llama", 4, 512, 8, 2, 1024, 1000, 4096, tie_embeddings=False)
    found = scan(Workload(spec, 8, "bf16", STACKS[stack]), hardware("h100-sxm"), 8, fixed, None, keep=100_000)
    return {scanned_layout(fields).cp_algorithm for _, fields in found.best}


def test_plan_tries_every_algorithm_for_plait_and_a_pin_keeps_one():
    assert _algorithms({"cp": 4}) == {"all-to-all", "ring", "all-gather"}
    assert _algorithms({"cp": 4, "cp_algorithm": "ring"}) == {"ring"}
    assert _algorithms({"cp": 4}, "megatron") == {"ring"}
    assert _algorithms({"cp": 1}) == {"all-to-all"}  # without cp the algorithm is left at its default


def test_simulate_takes_the_flag_and_the_ring_past_the_heads_cap(capsys):
    import json

    from plait.cli import main

    common = ["simulate", "--model", "llama-1b", "--gpu", "h100-sxm", "--global-batch", "8", "--json"]
    assert main([*common, "--gpus", "8", "--cp", "8", "--cp-algorithm", "ring"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"]["cp_algorithm"] == "ring"
    # 32 heads over tp 8 leave 4 a rank: cp 8 only on zig-zag shards (ring or all-gather), which the
    # search then picks by itself
    assert main([*common, "--gpus", "64", "--tp", "8", "--cp", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"]["cp_algorithm"] in ZIGZAG_ALGORITHMS
