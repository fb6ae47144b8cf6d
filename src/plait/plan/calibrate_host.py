"""What a CPU spends beyond its kernels, measured with plait's own model and optimizer.

On a CPU the host is the device: Python, the dispatcher and autograd's bookkeeping run on the
same core as the kernels, so a small layer costs far more than its matmuls. Two measurements feed
the profile (plait.plan.hardware):

* host overhead: plait's transformer at a size where kernels take microseconds, with one and with
  three layers, forward and forward + backward; the difference per layer, less what the kernel
  model (plait.plan.compute) already charges at that size, is the per-layer overhead, and what the
  one-layer model leaves beyond its layer is the per-pass overhead of embedding, head and loss;
* optimizer: plait's gradient clipping and AdamW step over many small tensors and over a few large
  ones, fitted to t = a·parameters + b·tensors.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from plait.config import TrainSpec
from plait.models.spec import ModelSpec, model_spec
from plait.models.transformer import Transformer
from plait.parallel.grad_norm import clip_grad_norm
from plait.plan.compute import head_times, layer_times
from plait.plan.hardware import Hardware, HostOverhead
from plait.plan.least_squares import relative_least_squares
from plait.plan.memory import Kernels
from plait.train.optim import build_optimizer

FAMILIES = ("gpt2", "llama")
PROBE_LAYERS = (1, 3)
PROBE_SHAPE = {"hidden": 64, "heads": 2, "vocab": 16, "seq_len": 8}  # kernels of a few microseconds


def interleaved_medians(probes: dict[str, Callable[[], object]], rounds: int = 15, min_time: float = 0.02) -> dict[str, float]:
    """Median seconds per call of each probe, the probes taking turns so that a neighbour's burst
    of load falls on all of them alike rather than on one."""
    for fn in probes.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in probes}
    for _ in range(rounds):
        for name, fn in probes.items():
            count, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < min_time or count == 0:
                fn()
                count += 1
            samples[name].append(elapsed / count)
    return {name: statistics.median(values) for name, values in samples.items()}


def probe_spec(family: str, layers: int) -> ModelSpec:
    kv_heads = 1 if family == "llama" else None  # grouped-query attention, as Llama's
    return model_spec(None, family=family, layers=layers, kv_heads=kv_heads, **PROBE_SHAPE)


def measure_host_overhead(profile: Hardware, precision: str) -> dict[str, HostOverhead]:
    """Per family: the host seconds per layer and per model pass that the kernel model misses."""
    kernels_only = replace(profile, host_overhead={}, host_runs_ahead=False)
    out = {}
    for family in FAMILIES:
        probes = {}
        for layers in PROBE_LAYERS:
            spec = probe_spec(family, layers)
            model = Transformer(spec)
            tokens = torch.randint(0, spec.vocab, (1, spec.seq_len))

            def loss(model=model, tokens=tokens) -> torch.Tensor:
                return F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())

            probes[f"forward{layers}"] = loss
            probes[f"both{layers}"] = lambda loss=loss: loss().backward()
        t = interleaved_medians(probes)
        few, many = PROBE_LAYERS
        spec = probe_spec(family, few)
        layer = layer_times(spec, kernels_only, precision, 1, kernels=Kernels(fused=False))
        head = head_times(spec, kernels_only, precision, 1, 1, 1)
        forward_per_layer = (t[f"forward{many}"] - t[f"forward{few}"]) / (many - few)
        backward_per_layer = (t[f"both{many}"] - t[f"both{few}"]) / (many - few) - forward_per_layer
        backward_few = t[f"both{few}"] - t[f"forward{few}"]
        out[family] = HostOverhead(
            layer_forward=max(0.0, forward_per_layer - layer.forward),
            layer_backward=max(0.0, backward_per_layer - layer.backward),
            model_forward=max(0.0, t[f"forward{few}"] - few * forward_per_layer - head.forward),
            model_backward=max(0.0, backward_few - few * backward_per_layer - head.backward),
        )
    return out


class _Parameters(nn.Module):
    def __init__(self, shapes: list[tuple[int, ...]]):
        super().__init__()
        self.tensors = nn.ParameterList(nn.Parameter(torch.randn(shape) * 0.02) for shape in shapes)


def measure_optimizer() -> tuple[float, float, list[dict]]:
    """(seconds per parameter, seconds per tensor, the measured points) of plait's clipping and
    AdamW step, as ``plait train`` runs them after every step."""
    sets = {
        "many small": [(64, 64)] * 48 + [(64,)] * 48,
        "few large": [(1024, 1024)] * 2 + [(1024,)] * 2,
        "mixed": [(512, 512)] * 8 + [(512,)] * 8,
    }
    probes, sizes = {}, {}
    for name, shapes in sets.items():
        module = _Parameters(shapes)
        optimizer = build_optimizer(module, TrainSpec())
        grads = [torch.randn_like(p) * 1e-3 for p in module.parameters()]

        def step(module=module, optimizer=optimizer, grads=grads) -> None:
            for p, g in zip(module.parameters(), grads):
                p.grad = g
            clip_grad_norm(module.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        probes[name] = step
        sizes[name] = (sum(p.numel() for p in module.parameters()), len(shapes))
    times = interleaved_medians(probes, rounds=7, min_time=0.05)
    per_parameter, per_tensor = relative_least_squares([tuple(map(float, sizes[n])) for n in sets], [times[n] for n in sets])
    points = [{"set": n, "parameters": sizes[n][0], "tensors": sizes[n][1], "measured_s": times[n],
               "predicted_s": sizes[n][0] * per_parameter + sizes[n][1] * per_tensor} for n in sets]
    return max(per_parameter, 0.0), max(per_tensor, 0.0), points
