"""plait.facts.weight_passes against the real model: the bytes autocast's weight casts and the
gradients' accumulation move in a block's ops, counted op by op, are the planner's."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from plait.facts.stack import STACKS
from plait.facts.weight_passes import NO_PASSES, end_gradient_bytes, end_passes, layer_gradient_bytes, layer_passes
from plait.layout import Layout
from plait.models.init import init_weights
from plait.models.spec import model_spec
from plait.models.transformer import Transformer, rotary_tables


class WeightPassTally(TorchDispatchMode):
    """Bytes read and written by casts of tensors shaped as a parameter (weights to bf16, their
    gradients back to fp32) and by in-place adds into a parameter's gradient."""

    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.shapes = {tuple(p.shape) for p in block.parameters()}
        self.block = block
        self.casts = self.accumulations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if name == "_to_copy" and tuple(args[0].shape) in self.shapes and args[0].dtype != out.dtype:
            self.casts += nbytes
        elif name == "add_" and any(p.grad is not None and args[0].data_ptr() == p.grad.data_ptr()
                                    for p in self.block.parameters()):
            self.accumulations += nbytes
        return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_blocks_casts_and_gradient_accumulation_move_what_the_planner_counts(family):
    """Two micro-batches of one block in bf16 autocast over fp32 weights, the backward outside
    autocast as plait's loop runs it: each casts every linear's weight (and GPT-2's biases) forward
    and its gradient back, and the second adds every gradient into the first's. Shapes are chosen so
    that no activation has a parameter's shape."""
    spec = model_spec(None, family=family, layers=1, hidden=64, heads=4, vocab=16, seq_len=24,
                      kv_heads=2 if family == "llama" else None)
    model = Transformer(spec)
    init_weights(model, spec, seed=0)
    block = model.layers["0"]
    rotary = rotary_tables(spec, spec.seq_len) if family == "llama" else None
    tally = WeightPassTally(block)
    with tally:
        for micro_batch in range(2):
            x = torch.randn(2, spec.seq_len, spec.hidden, generator=torch.Generator().manual_seed(micro_batch))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = block(x, rotary)
            y.float().square().mean().backward()
    layout = Layout(microbatches=2)
    passes = layer_passes(spec, layout, "bf16", STACKS["plait"])
    assert passes.forward > 0 and tally.casts == 2 * (passes.forward + passes.backward)
    assert tally.accumulations == layer_gradient_bytes(spec, layout, "bf16", STACKS["plait"]) > 0


def test_weights_already_in_bf16_are_not_cast_and_their_gradients_accumulate_in_bf16():
    """ZeRO 1 and 2 hold bf16 weights, with or without pipeline stages: nothing to cast, half the
    accumulation (none at ZeRO-2 without stages, which reduce-scatters every micro-batch's). On a
    pipeline stage ZeRO 0 keeps and ZeRO-3 gathers fp32 weights, cast as at ZeRO 0 without stages.
    One micro-batch accumulates nothing; a reference stack's fitted figures already hold its passes."""
    spec, plait = model_spec("tiny"), STACKS["plait"]
    zero0, zero1 = Layout(microbatches=2), Layout(dp=2, zero=1, microbatches=2)
    assert layer_passes(spec, zero1, "bf16", plait) == NO_PASSES
    assert 2 * layer_gradient_bytes(spec, zero1, "bf16", plait) == layer_gradient_bytes(spec, zero0, "bf16", plait)
    assert layer_gradient_bytes(spec, Layout(dp=2, zero=2, microbatches=2), "bf16", plait) == 0.0
    for zero in (0, 1, 2, 3):
        staged = Layout(dp=2, pp=2, zero=zero, microbatches=2)
        unstaged = zero0 if zero in (0, 3) else zero1
        assert layer_passes(spec, staged, "bf16", plait) == layer_passes(spec, unstaged, "bf16", plait)
        assert layer_gradient_bytes(spec, staged, "bf16", plait) == layer_gradient_bytes(spec, unstaged, "bf16", plait)
    assert layer_gradient_bytes(spec, Layout(), "bf16", plait) == 0.0
    assert layer_passes(spec, Layout(), "bf16", STACKS["megatron"]) == NO_PASSES
    assert layer_gradient_bytes(spec, zero0, "bf16", STACKS["megatron"]) == 0.0


class EndPassTally(TorchDispatchMode):
    """Bytes of the passes over tensors shaped as the vocabulary table (as held, or as the aligned
    projection pads its cast): casts, the padding and its cut, the sum of a tied weight's two
    gradients, the embedding's dense gradient (written) and the accumulation into a gradient."""

    def __init__(self, shapes: set[tuple[int, ...]]):
        super().__init__()
        self.shapes = shapes
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if name == "embedding_dense_backward" and tuple(out.shape) in self.shapes:  # (not the positions')
            self.bytes += out.numel() * out.element_size()
        elif name in ("_to_copy", "constant_pad_nd", "add", "add_") and all(tuple(t.shape) in self.shapes for t in tensors):
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


@pytest.mark.parametrize("family, vocab, tied", [("llama", 200, False), ("gpt2", 203, True)])
def test_the_embedding_and_heads_passes_move_what_the_planner_counts(family, vocab, tied):
    """A whole one-layer model, two micro-batches in bf16 autocast over fp32 weights: Llama's untied
    table of 200 rows, GPT-2's tied one of 203 (no multiple of 8: the projection pads its cast to 208
    rows, the planner counts the padding's passes over 203, so 1% apart)."""
    spec = model_spec(None, family=family, layers=1, hidden=64, heads=4, vocab=vocab, seq_len=24,
                      kv_heads=2 if family == "llama" else None, tie_embeddings=tied)
    model = Transformer(spec)
    init_weights(model, spec, seed=0)
    tally = EndPassTally({(vocab, spec.hidden), (vocab + -vocab % 8, spec.hidden)})
    tokens = torch.randint(0, vocab, (2, spec.seq_len), generator=torch.Generator().manual_seed(0))
    with tally:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(tokens)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
    layout, plait = Layout(microbatches=2), STACKS["plait"]
    passes = end_passes(spec, layout, "bf16", plait, True, True)
    expected = 2 * (passes.forward + passes.backward) + end_gradient_bytes(spec, layout, "bf16", plait, True, True)
    assert tally.bytes == pytest.approx(expected, rel=0.0 if vocab % 8 == 0 else 0.01)


def test_the_simulated_trace_ends_with_the_steps_gradient_accumulation():
    """`plait simulate --trace` draws the accumulation the step pays after its schedule, so the
    trace ends where the predicted step does."""
    from plait.hardware import hardware
    from plait.observe.trace import simulated_trace
    from plait.plan.simulate import evaluate
    from plait.plan.simulated_step import flush_spans, simulated_timeline
    from plait.plan.workload import Workload

    workload, hw, layout = Workload(model_spec("llama-1b"), 16, "bf16"), hardware("h100-sxm"), Layout(microbatches=16)
    trace = simulated_trace(simulated_timeline(workload, hw, 1, layout), flush_spans(workload, hw, 1, layout), layout)
    events = [event for event in trace["traceEvents"] if event.get("ph") == "X"]
    assert [event["dur"] for event in events if event["name"] == "gradient accumulation"][0] > 0
    end = max(event["ts"] + event["dur"] for event in events)
    assert end == pytest.approx(evaluate(workload, hw, 1, layout).step_time_s * 1e6, rel=1e-6)
