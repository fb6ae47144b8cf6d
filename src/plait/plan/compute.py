"""Time of one layer's compute on one rank, from the matrix shapes a layout produces.

A matmul takes the longer of its FLOPs at the achievable peak and its bytes at memory bandwidth
(a roofline), plus a launch cost. The achievable peak is the device's large-matmul efficiency
times the fraction of its output tiles that hold real rows and columns, so thin shards (high tp,
small micro-batches, short sequences per cp rank) fall off the peak as they do on real devices.
Norms, activations, residual adds, RoPE and (without flash attention) softmax are bound by memory
traffic. A flash kernel's attention is bound by its FLOPs (its scores never leave the chip) plus its
softmax's exponentials on the special-function units. The FLOPs these times cover are exactly plait.models.flops's: tests hold the two equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from plait.facts.activations import ACTIVATION_BYTES, op_keeps_attention
from plait.facts.model_state import PipelineShare, padded_vocab
from plait.facts.stack import DEFAULT_STACK, STACKS, Kernels
from plait.facts.weight_passes import (NO_PASSES, WeightPasses, end_gradient_bytes, end_passes, layer_gradient_bytes)
from plait.layout import ZIGZAG_ALGORITHMS, Layout
from plait.models.flops import block_norms, kv_heads_per_rank, linear_shapes, recomputed_linears
from plait.models.spec import ModelSpec
from plait.hardware import Hardware, HostOverhead, KernelScale
from plait.plan.workload import Workload

# Non-matmul kernels one layer launches forward (two norms, two residual adds, the activation,
# rotary or bias adds, attention's softmax path); the backward launches about twice as many.
ELEMENTWISE_KERNELS = 12
# A dropout mask's bytes in passes of a 16-bit tensor of its shape (one byte an element).
MASK_PASS = 0.5
# plait's blockwise attention (plait.parallel.ring_attention; its ring and all-gather context
# parallelism run it) is plain PyTorch: per K/V block, batched matmuls whose scores go through
# memory, then fp32 passes over every score: forward scaled, shifted by the log-sum-exp and
# exponentiated (7 passes of 4 bytes), backward the same recomputed and the probabilities' gradient
# formed (13); at half precision two casts to and from fp32 a score forward and four backward (4 + 2
# bytes each); a causal block's mask fill and mask (9 bytes). tests/test_gathered_attention.py counts
# them from the ops the kernel dispatches.
BLOCK_PASSES = {"forward": 7, "backward": 13}
BLOCK_CASTS = {"forward": 2, "backward": 4}
CAUSAL_MASK_BYTES = 9


@dataclass(frozen=True)
class Gemm:
    """``batch`` independent (m×k)·(k×n) products."""

    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch


def matmul_rate(hw: Hardware, precision: str, rows: int, columns: int) -> float:
    """FLOP/s of a matmul whose output is rows × columns: the achievable peak times the share of its
    output tiles that hold real rows and columns."""
    tile = hw.matmul_tile
    fill = (rows / (tile * math.ceil(rows / tile))) * (columns / (tile * math.ceil(columns / tile)))
    return hw.peak_tflops(precision) * 1e12 * hw.matmul_efficiency * fill


def gemm_seconds(hw: Hardware, precision: str, g: Gemm) -> float:
    """Predicted time of one matmul kernel on ``hw``."""
    traffic = ACTIVATION_BYTES[precision] * g.batch * (g.m * g.k + g.k * g.n + g.m * g.n)
    return max(g.flops / matmul_rate(hw, precision, g.m, g.n), traffic / (hw.memory_gbps * 1e9)) + hw.kernel_overhead_s


def attention_matmul_seconds(hw: Hardware, precision: str, scores: Gemm, flash: bool) -> float:
    """Attention's two matmuls over the full square of ``scores`` (queries × keys, contracted over
    the head dimension, for each of ``batch`` heads): apart, the score matrix written and read
    through memory like any matmul's output; in one flash kernel, which keeps each tile of scores
    on chip, only Q, K, V and the output cross memory, and the tiles span the square."""
    if not flash:
        return (gemm_seconds(hw, precision, scores)
                + gemm_seconds(hw, precision, Gemm(scores.m, scores.k, scores.n, scores.batch)))
    traffic = ACTIVATION_BYTES[precision] * scores.batch * scores.k * 2 * (scores.m + scores.n)
    return (max(2 * scores.flops / matmul_rate(hw, precision, scores.m, scores.n), traffic / (hw.memory_gbps * 1e9))
            + hw.kernel_overhead_s)


@dataclass(frozen=True)
class LayerShape:
    """The matmuls of one layer on one rank for one micro-batch, forward pass."""

    weights: tuple[Gemm, ...]
    attention: tuple[Gemm, ...]
    scores: int
    elementwise_bytes: float
    activation_bytes: float
    softmax_bytes: float


def layer_shape(spec: ModelSpec, micro_batch: int, tp: int, cp: int, sp: bool, precision: str, kernels: Kernels) -> LayerShape:
    e = ACTIVATION_BYTES[precision]
    s_local = spec.seq_len // cp
    tokens = micro_batch * s_local
    h, f, d = spec.hidden, spec.ffn_hidden, spec.head_dim
    kv = kv_heads_per_rank(spec, tp) * d
    up = (2 if spec.gated_mlp else 1) * f // tp
    weights = (
        Gemm(tokens, h // tp + 2 * kv, h),  # fused Q, K, V projection (column-parallel)
        Gemm(tokens, h, h // tp),  # attention output projection (row-parallel)
        Gemm(tokens, up, h),  # MLP up (and gate) projection
        Gemm(tokens, h, f // tp),  # MLP down projection
    )
    heads = micro_batch * spec.heads // tp
    attention = (Gemm(s_local, spec.seq_len, d, heads), Gemm(s_local, d, spec.seq_len, heads))
    # Hidden-width passes: two norms, two residual adds (2 reads + write), and with dropout two
    # masked copies (read, write, a 1-byte mask), which fused kernels (Megatron-LM's
    # bias_dropout_add) do in the add's kernel: read both, write the sum and the mask. Sequence
    # parallelism splits them over tp, otherwise each tp rank repeats them.
    # Unfused, RMSNorm is ~6 passes (square, mean, rsqrt, two multiplies), SwiGLU's silu and
    # product 5, and plait's rotary (pairs times cos and sin, sum, difference, stack) ~17 over Q
    # and K, against 2, 3 and 2 when fused.
    norm_passes = 6 if spec.norm_kind == "rmsnorm" and not kernels.fused else 2
    adds = (2 * (3 + MASK_PASS) if kernels.fused else 2 * 3 + 2 * (2 + MASK_PASS)) if kernels.dropout else 2 * 3
    hidden_passes = block_norms(spec) * norm_passes + adds
    hidden_bytes = hidden_passes * tokens * h * e / (tp if sp else 1)
    mlp_passes = (3 if kernels.fused else 5) if spec.gated_mlp else 2
    mlp_bytes = mlp_passes * tokens * f / tp * e
    rope_passes = 2 if kernels.fused else 17
    rope_bytes = rope_passes * tokens * (h // tp + kv) * e if spec.rotary_positions else 0
    scores = heads * s_local * spec.seq_len
    softmax = 0.0 if kernels.flash_attention else scores * e * (3 if not kernels.dropout else 6)
    return LayerShape(weights, attention, scores, hidden_bytes + rope_bytes, mlp_bytes, softmax)


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one layer for one micro-batch: forward, backward (input, weight), recompute,
    and the attention core's forward and backward alone (what context-parallel transfers hide under)."""

    forward: float
    backward_input: float
    backward_weight: float
    recompute: float
    attention: float = 0.0
    attention_backward: float = 0.0

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight


def block_score_bytes(direction: str, precision: str) -> int:
    """Bytes plait's blockwise attention moves a score outside its matmuls, forward or backward."""
    e = ACTIVATION_BYTES[precision]
    return 4 * BLOCK_PASSES[direction] + (BLOCK_CASTS[direction] * (4 + e) if e != 4 else 0)


def block_kernel_seconds(hw: Hardware, precision: str, heads: int, rows: int, keys: int, dim: int,
                         masked: int) -> tuple[float, float]:
    """(forward, backward) of plait's blockwise attention of ``rows`` queries over ``keys`` keys for
    each of ``heads`` heads, ``masked`` of the scores in causal blocks, as modelled: forward two
    matmuls writing and reading the scores, backward five (the scores again, dV, dP, dQ, dK), and
    the fp32 passes of ``block_score_bytes`` over every score."""
    # (passes over tensors of activation size, exponentials among them: the rate of activations)
    scores, memory_rate = heads * rows * keys, (hw.activation_gbps or hw.memory_gbps) * 1e9
    mask = masked * CAUSAL_MASK_BYTES / memory_rate
    matmuls = attention_matmul_seconds(hw, precision, Gemm(rows, keys, dim, heads), flash=False)
    return (matmuls + scores * block_score_bytes("forward", precision) / memory_rate + mask,
            2.5 * matmuls + scores * block_score_bytes("backward", precision) / memory_rate + mask)


def blockwise_attention_seconds(spec: ModelSpec, hw: Hardware, precision: str, micro_batch: int, tp: int,
                                cp: int) -> tuple[float, float]:
    """(forward, backward) of plait's blockwise attention over cp blocks of s/cp keys: its own block
    whole under the causal mask, each other rank's half (plait.parallel.ring_attention.step_blocks);
    scaled as calibrate measured the kernel at blocks the size of its own (``Hardware.block_scales``)."""
    local, heads = spec.seq_len // cp, micro_batch * spec.heads // tp
    forward, backward = block_kernel_seconds(hw, precision, heads, local, local * (cp + 1) // 2, spec.head_dim,
                                             heads * local * local)
    forward_scale, backward_scale = hw.block_scales(heads * local * local)
    return forward * forward_scale, backward * backward_scale


def layer_times(spec: ModelSpec, hw: Hardware, layout: Layout, micro_batch: int, precision: str,
                kernels: Kernels = STACKS[DEFAULT_STACK], weight_passes: WeightPasses = NO_PASSES) -> LayerTimes:
    """Predicted compute time of one transformer layer on one rank of ``layout`` (its tp, cp, sp, cp
    algorithm and recomputation; no communication), with the engine's passes over its weights
    (plait.facts.weight_passes)."""
    return layer_times_by_recompute(spec, hw, layout, micro_batch, precision, kernels, weight_passes)(layout.recompute)


def layer_times_by_recompute(spec: ModelSpec, hw: Hardware, layout: Layout, micro_batch: int, precision: str,
                             kernels: Kernels, weight_passes: WeightPasses) -> Callable[[str], LayerTimes]:
    """``layer_times`` as a function of the recomputation (the layout's own is not read): what every
    recomputation shares computed once, here (the planner's search asks for several at a time)."""
    tp, cp, sp, cp_algorithm = layout.tp, layout.cp, layout.sp, layout.cp_algorithm
    shape = layer_shape(spec, micro_batch, tp, cp, sp, precision, kernels)
    memory_rate = hw.memory_gbps * 1e9
    weights = sum(gemm_seconds(hw, precision, g) for g in shape.weights)
    attention_as_matmuls = attention_matmul_seconds(hw, precision, shape.attention[0], kernels.flash_attention)
    # (the attention figures describe the device's flash kernel; written-out scores run as matmuls)
    attention_matmuls = attention_as_matmuls / (hw.attention_efficiency if kernels.flash_attention else 1.0)
    exponentials = shape.scores * hw.attention_score_s
    # (a softmax kernel that reads and writes the scores is bound by those bytes or its exponentials)
    score_passes = exponentials if kernels.flash_attention else max(exponentials, shape.softmax_bytes / memory_rate)
    attention = attention_matmuls + score_passes
    # Backward of attention: a flash kernel recomputes the scores, its matmuls
    # ``attention_backward_ratio`` of the forward's and its exponentials once more (or its own fit,
    # where calibrate measured one on a GPU); without one, dQ, dK, dV and the probabilities' gradient
    # are four matmuls against the forward's two, and the softmax's and dropout's backward pass over
    # the score matrices as often as their forward did.
    if kernels.plait_engine and cp > 1 and cp_algorithm in ZIGZAG_ALGORITHMS:
        attention, attention_backward = blockwise_attention_seconds(spec, hw, precision, micro_batch, tp, cp)
    elif not kernels.flash_attention:
        attention_backward = 2 * attention_matmuls + score_passes
    elif hw.attention_backward_efficiency is not None:
        attention_backward = attention_as_matmuls / hw.attention_backward_efficiency + shape.scores * hw.attention_backward_score_s
    else:
        attention_backward = hw.attention_backward_ratio * attention_matmuls + exponentials
    activation_rate = (hw.activation_gbps or hw.memory_gbps) * 1e9
    elementwise = (shape.elementwise_bytes / memory_rate + shape.activation_bytes / activation_rate
                   + ELEMENTWISE_KERNELS * hw.kernel_overhead_s)
    weight_forward, weight_backward, weight_recomputed = (passed / memory_rate for passed in weight_passes)
    host, scale = host_overhead(hw, spec), hw.layer_kernel_scale.get(spec.family, UNSCALED)
    # (a stack whose host cannot run ahead adds its own time to each layer's forward and backward, and
    # a stack's cost per layer pass under tensor parallelism its own)
    tp_pass = kernels.tp_layer_pass_s if tp > 1 else 0.0
    forward = with_host(hw, scale.forward * (weights + attention + elementwise + weight_forward),
                        host.layer_forward) + tp_pass
    # Backward: dX = dY·Wᵀ is an (m×n)·(n×k) product, dW = Xᵀ·dY a (k×m)·(m×n) one.
    grad_input = sum(gemm_seconds(hw, precision, Gemm(g.m, g.k, g.n, g.batch)) for g in shape.weights)
    grad_weight = scale.backward * (sum(gemm_seconds(hw, precision, Gemm(g.k, g.n, g.m, g.batch)) for g in shape.weights)
                                    + weight_backward)
    backward_input = with_host(hw, scale.backward * (grad_input + attention_backward + 2 * elementwise),
                               host.layer_backward) + tp_pass
    attention *= scale.forward
    tokens = micro_batch * spec.seq_len // cp
    shapes = linear_shapes(spec, tp)

    def under(recompute: str) -> LayerTimes:
        extra = {"none": 0.0, "selective": attention}.get(recompute)
        if recompute == "full":  # the forward, but for a closing w2 no backward needs (plait.models.flops.layer_flops)
            closing = (0.0 if kernels.recompute_whole_forward
                       else gemm_seconds(hw, precision, Gemm(tokens, *shapes["w2"][::-1])))
            extra = forward - scale.forward * (closing + weight_forward - weight_recomputed)
        elif recompute == "op":  # the unkept matmuls and every elementwise kernel run again
            rerun = sum(gemm_seconds(hw, precision, Gemm(tokens, *shapes[name][::-1]))
                        for name in recomputed_linears(spec))
            extra = with_host(hw, scale.forward * (rerun + elementwise + weight_recomputed), host.layer_forward)
            if not op_keeps_attention(kernels, cp, cp_algorithm):
                extra += attention
        return LayerTimes(forward, backward_input, grad_weight, extra, attention, scale.backward * attention_backward)

    return under


def gradient_seconds(workload: Workload, hw: Hardware, layout: Layout, share: PipelineShare) -> float:
    """A step's accumulation of the gradients (plait.facts.weight_passes) on a rank holding ``share``
    of the model, the layers' at their kernels' backward scale. It runs in the micro-batches' backwards; charged to the step, it leaves
    out what it would add to a pipeline's bubble, at most (pp − 1)/m of it."""
    spec, precision, kernels = workload.spec, workload.precision, workload.kernels
    scale = hw.layer_kernel_scale.get(spec.family, UNSCALED)
    return ((share.layers * scale.backward * layer_gradient_bytes(spec, layout, precision, kernels)
             + end_gradient_bytes(spec, layout, precision, kernels, share.first, share.last)) / (hw.memory_gbps * 1e9))


def end_pass_seconds(spec: ModelSpec, hw: Hardware, layout: Layout, precision: str, kernels: Kernels, first: bool,
                     last: bool) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of the passes over the embedding and head of a rank
    holding the first and last stage, as ``first`` and ``last`` say (plait.facts.weight_passes)."""
    passes = end_passes(spec, layout, precision, kernels, first, last)
    return passes.forward / (hw.memory_gbps * 1e9), passes.backward / (hw.memory_gbps * 1e9)


NO_OVERHEAD = HostOverhead()
UNSCALED = KernelScale()


def host_overhead(hw: Hardware, spec: ModelSpec) -> HostOverhead:
    return hw.host_overhead.get(spec.family, NO_OVERHEAD)


def with_host(hw: Hardware, device_s: float, host_s: float) -> float:
    """Time of work whose kernels take ``device_s`` and whose host code takes ``host_s``: a host
    that runs ahead hides under the kernels (or they under it); one that is the device adds."""
    return max(device_s, host_s) if hw.host_runs_ahead else device_s + host_s


def head_times(spec: ModelSpec, hw: Hardware, precision: str, micro_batch: int, tp: int, cp: int) -> LayerTimes:
    """The output projection and its loss on the last stage (vocabulary split over tp)."""
    tokens = micro_batch * spec.seq_len // cp
    rows = padded_vocab(spec.vocab, tp) // tp
    g = Gemm(tokens, rows, spec.hidden)
    loss = 3 * tokens * rows * 4 / (hw.memory_gbps * 1e9)  # fp32 softmax cross-entropy
    host = host_overhead(hw, spec)  # embedding, head and loss: counted with the head
    forward = with_host(hw, gemm_seconds(hw, precision, g) + loss, host.model_forward)
    backward_input = with_host(hw, gemm_seconds(hw, precision, Gemm(g.m, g.k, g.n)) + loss, host.model_backward)
    return LayerTimes(forward, backward_input, gemm_seconds(hw, precision, Gemm(g.k, g.n, g.m)), 0.0)


def optimizer_seconds(hw: Hardware, parameters: float, tensors: int, precision: str) -> float:
    """Clipping and Adam over ``parameters`` local parameters in ``tensors`` tensors: as measured
    by calibrate, or memory-bound at ~36 bytes (bf16) or 28 (fp32) per parameter."""
    if hw.optimizer_parameter_s is not None:
        per_parameter = hw.optimizer_parameter_s
    else:
        per_parameter = (36 if precision == "bf16" else 28) / (hw.memory_gbps * 1e9)
    return parameters * per_parameter + tensors * hw.optimizer_tensor_s
