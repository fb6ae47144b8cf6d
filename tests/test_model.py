"""The single-device transformer: sizes from the spec, FLOPs, attention and rotary positions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop, sdpa_flop

from plait.models.flops import flops_per_sequence, parameter_count
from plait.models.init import init_weights
from plait.models.spec import PRESETS, model_spec
from plait.models.transformer import Attention, Transformer, apply_rotary, rotary_tables

aten = torch.ops.aten


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_count_matches_the_built_model(name):
    spec = PRESETS[name]
    with torch.device("meta"):
        model = Transformer(spec)
    assert parameter_count(spec) == sum(p.numel() for p in model.parameters())


def test_published_sizes():
    """Figures from the model cards / papers, to the parameter where they are published exactly."""
    assert parameter_count(PRESETS["gpt2"]) == 124_439_808
    assert parameter_count(PRESETS["gpt2-xl"]) == 1_557_611_200
    assert round(parameter_count(PRESETS["llama-8b"]) / 1e9, 2) == 8.03
    assert round(parameter_count(PRESETS["llama-70b"]) / 1e9, 1) == 70.6
    assert round(parameter_count(PRESETS["gpt3-175b"]) / 1e9) == 175


def test_small_presets_build_and_run_on_cpu():
    for name in ("tiny", "tiny-llama"):
        spec = PRESETS[name]
        model = Transformer(spec)
        logits = model(torch.randint(0, spec.vocab, (2, 16)))
        assert logits.shape == (2, 16, spec.vocab)
        assert torch.isfinite(logits).all()


class MatmulColumns(TorchDispatchMode):
    """The output widths of every matmul run under it."""

    def __init__(self):
        super().__init__()
        self.columns = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (aten.mm.default, aten.addmm.default, aten.bmm.default):
            self.columns.add(out.shape[-1])
        return out


def unaligned_vocabulary_model(tied: bool) -> tuple[Transformer, torch.Tensor, list[torch.Tensor]]:
    """tiny with a vocabulary of 257, a batch of its ids, and where its final norm's outputs land."""
    torch.manual_seed(0)
    model = Transformer(model_spec("tiny", vocab=257, tie_embeddings=tied))
    normed = []
    model.norm.register_forward_hook(lambda module, args, output: normed.append(output))
    return model, torch.randint(0, 257, (2, 16), generator=torch.Generator().manual_seed(1)), normed


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_an_unaligned_vocabulary_projects_through_aligned_rows_to_the_same_logits_and_gradients(tied):
    """Vocabulary 257 under bf16 autocast: the output matmul runs over 264 rows (a multiple of 8,
    tensor cores' alignment) and keeps the padded bf16 cast of the weight in place of the cast; the
    logits and every gradient equal the plain projection's. In fp64 the matmul is left as it is."""
    model, inputs, normed = unaligned_vocabulary_model(tied)
    head = model.tok_embeddings.weight if tied else model.output.weight
    saved = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with MatmulColumns() as seen, torch.autograd.graph.saved_tensors_hooks(
                lambda tensor: saved.append((tuple(tensor.shape), tensor.dtype)) or tensor, lambda tensor: tensor):
            logits = model(inputs)
        plain = F.linear(normed[0], head)
    assert 264 in seen.columns and 257 not in seen.columns
    assert ((128, 264), torch.bfloat16) in saved and ((128, 257), torch.bfloat16) not in saved  # kept transposed
    assert logits.shape == (2, 16, 257) and torch.allclose(logits.float(), plain.float(), rtol=1e-2, atol=1e-2)

    def gradients(out: torch.Tensor) -> list[torch.Tensor]:
        loss = F.cross_entropy(out.flatten(0, 1).float(), inputs.flatten())
        return torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)

    for padded, straight in zip(gradients(logits), gradients(plain)):
        assert torch.allclose(padded, straight, rtol=2e-2, atol=1e-4)
    with MatmulColumns() as seen:
        model.double()(inputs)
    assert 257 in seen.columns and 264 not in seen.columns


def test_bf16_weights_project_as_they_are_keeping_the_weight_itself():
    """With the weights themselves in bf16 (ZeRO 1-2, FSDP2), with autocast on or off, padding would keep
    a copy beside the parameter: the matmul runs the vocabulary's rows and keeps the parameter."""
    model, inputs, _ = unaligned_vocabulary_model(tied=False)
    model.bfloat16()
    for autocast in (False, True):
        kept = []
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), MatmulColumns() as seen, \
                torch.autograd.graph.saved_tensors_hooks(lambda tensor: kept.append(tensor) or tensor, lambda tensor: tensor):
            model(inputs)
        assert 257 in seen.columns and 264 not in seen.columns
        assert any(tensor.data_ptr() == model.output.weight.data_ptr() for tensor in kept)


# The CPU attention kernel has no formula registered; give it PyTorch's own SDPA formulas.
CPU_ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu: sdpa_flop.__wrapped__,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_backward_flop.__wrapped__,
}


def counted_flops(spec, model: torch.nn.Module, batch: int) -> tuple[int, int]:
    """(forward, backward) FLOPs torch's counter sees in one step of ``model`` on ``batch`` sequences."""
    inputs = torch.randint(0, spec.vocab, (batch, spec.seq_len), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as forward_counter:
        logits = model(inputs)
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as backward_counter:
        F.cross_entropy(logits.flatten(0, 1), inputs.flatten()).backward()
    return forward_counter.get_total_flops(), backward_counter.get_total_flops()


class NormAutocast(TorchFunctionMode):
    """Whether autocast was on for the CPU as each norm ran, and the dtypes it took and returned."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[bool, torch.dtype, torch.dtype]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (F.layer_norm, F.rms_norm):
            self.seen.append((torch.is_autocast_enabled("cpu"), args[0].dtype, out.dtype))
        return out


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norms_run_outside_autocast_in_their_inputs_dtype(name, dtype):
    """Under bf16 autocast each norm runs in the residual stream's own dtype (fp32 over fp32 weights,
    bf16 over bf16 ones) and returns it, whatever the device's autocast lists say of norms (CUDA's
    run them in fp32): what the next linears read, keep and gather is the same on a CPU and a GPU."""
    model = Transformer(model_spec(name, seq_len=16)).to(dtype)
    tokens = torch.randint(0, model.spec.vocab, (2, 16))
    tally = NormAutocast()
    with torch.autocast("cpu", dtype=torch.bfloat16), tally:
        model(tokens, torch.arange(16))
    assert tally.seen and all(not on and seen == dtype and out == dtype for on, seen, out in tally.seen)


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_the_model_is_built_from_its_specs_features(name):
    """The norm, positions, MLP and biases built are those the spec's features name (what the facts count)."""
    spec = model_spec(name)
    model = Transformer(spec)
    block = model.layers["0"]
    norm = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[spec.norm_kind]
    assert type(block.attention_norm).__name__ == type(model.norm).__name__ == norm
    assert (model.pos_embeddings is not None) == spec.learned_positions
    assert hasattr(model, "rope_cos") == spec.rotary_positions
    assert (block.mlp.w3 is not None) == spec.gated_mlp
    assert {linear.bias is not None for linear in (block.attention.wq, block.attention.wo, block.mlp.w1)} == {spec.has_bias}


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_flops_match_torch_flop_counter(name):
    spec = model_spec(name, seq_len=32)
    forward, backward = counted_flops(spec, Transformer(spec), batch=3)
    expected = flops_per_sequence(spec)
    assert forward == 3 * expected.forward
    assert backward == 3 * expected.backward


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("recompute", ["selective", "op", "full"])
def test_recompute_flops_are_what_the_recomputed_backward_runs_again(name, recompute):
    """The backward of a recomputing model runs the plain backward's FLOPs plus exactly the
    recomputation flops_per_sequence names: the attention core, every second matmul, or the forward."""
    from plait.parallel.recompute import apply_recompute

    spec = model_spec(name, seq_len=32)
    model = apply_recompute(Transformer(spec), (recompute,) * spec.layers)
    forward, backward = counted_flops(spec, model, batch=3)
    expected = flops_per_sequence(spec, recompute=recompute)
    assert forward == 3 * expected.forward
    assert backward == 3 * (expected.backward + expected.recompute)


def test_recompute_flops_add_forward_work():
    spec = PRESETS["gpt2"]
    none, selective, op, full = (flops_per_sequence(spec, recompute=r) for r in ("none", "selective", "op", "full"))
    assert none.recompute == 0
    assert 0 < selective.recompute < full.recompute and 0 < op.recompute < full.recompute < full.forward
    assert none.model == full.model and full.hardware > none.hardware


def reference_attention(attention: Attention, x: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention written out with an explicit mask and softmax."""
    batch, seq, hidden = x.shape
    heads, kv_heads, head_dim = attention.heads, attention.kv_heads, attention.head_dim
    q = attention.wq(x).view(batch, seq, heads, head_dim)
    k = attention.wk(x).view(batch, seq, kv_heads, head_dim)
    v = attention.wv(x).view(batch, seq, kv_heads, head_dim)
    out = torch.empty(batch, seq, heads, head_dim)
    mask = torch.ones(seq, seq).tril().bool()
    for h in range(heads):
        g = h // (heads // kv_heads)  # query head h reads kv head g
        scores = q[:, :, h] @ k[:, :, g].transpose(1, 2) / math.sqrt(head_dim)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        out[:, :, h] = weights @ v[:, :, g]
    return attention.wo(out.reshape(batch, seq, hidden))


def test_grouped_query_attention_matches_reference():
    spec = model_spec("tiny-llama", heads=8, kv_heads=2)
    attention = Attention(spec)
    x = torch.randn(2, 10, spec.hidden)
    torch.testing.assert_close(attention(x, None), reference_attention(attention, x), rtol=1e-5, atol=1e-5)


def test_rotary_scores_depend_only_on_relative_position():
    spec = PRESETS["tiny-llama"]
    cos, sin = rotary_tables(spec, 64)
    q, k = torch.randn(spec.head_dim), torch.randn(spec.head_dim)

    def score(i: int, j: int) -> float:
        qi = apply_rotary(q.view(1, 1, 1, -1), cos[i:i + 1], sin[i:i + 1])
        kj = apply_rotary(k.view(1, 1, 1, -1), cos[j:j + 1], sin[j:j + 1])
        return float((qi * kj).sum())

    assert score(5, 2) == pytest.approx(score(40, 37), rel=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), rel=1e-3)
    assert score(0, 0) == pytest.approx(float(q @ k), rel=1e-5)


def test_same_seed_same_weights_and_other_seed_differs():
    spec = PRESETS["tiny"]
    first, second, third = Transformer(spec), Transformer(spec), Transformer(spec)
    init_weights(first, spec, seed=1)
    torch.manual_seed(1234)  # the global RNG must play no part
    init_weights(second, spec, seed=1)
    init_weights(third, spec, seed=2)
    for (name, a), b, c in zip(first.named_parameters(), second.parameters(), third.parameters()):
        assert torch.equal(a, b), name
        if a.dim() >= 2:
            assert not torch.equal(a, c), name


@pytest.mark.parametrize("top_k", [0, 3])
def test_sampling_at_a_tiny_temperature_is_greedy(top_k):
    """A temperature near zero (1e-40) gives the argmax, not inf or nan probabilities."""
    from plait.sample import generate

    torch.manual_seed(0)
    model = Transformer(model_spec(None, family="gpt2", layers=1, hidden=32, heads=2, vocab=64, seq_len=16)).eval()
    prompt = [1, 2, 3]
    assert generate(model, prompt, 4, temperature=1e-40, top_k=top_k) == generate(model, prompt, 4)
