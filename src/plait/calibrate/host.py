"""What a device spends beyond its kernels, measured with plait's own model and optimizer.

On a CPU the host is the device: Python, the dispatcher and autograd's bookkeeping run on the
same core as the kernels, so a small layer costs far more than its matmuls. (A GPU's host queues
kernels ahead, so its time shows only where it exceeds theirs; plait.calibrate.gpu runs the same
probes on a GPU at its own sizes, ``ProbeSizes``.) Four measurements feed the profile
(plait.hardware):

* host overhead: plait's transformer at a size where kernels take microseconds, with one and with
  four layers, forward and forward + backward; the difference per layer, less what the kernel
  model (plait.plan.compute) already charges at that size, is the per-layer overhead, and what the
  one-layer model leaves beyond its layer is the per-pass overhead of embedding, head and loss;
* layer kernel scale: the same model at a working size (kernels of milliseconds), one and four
  layers; its per-layer time less that host overhead, over the kernel model's time, forward and
  backward. A layer's kernels read what the previous one wrote and stream its weights, which
  kernels timed one at a time on hot inputs do not (here they took 1.0–1.5× their sum);
* optimizer: plait's gradient clipping and AdamW step over many small tensors and over a few large
  ones, fitted to t = a·parameters + b·tensors;
* wrapper overhead: on two ranks, a whole ``plait train`` step of the same small model under each
  parallel wrapper (DDP, ZeRO 1–3, tensor, sequence, context parallel) with one and with four
  layers, against the planner's prediction of it; what the prediction misses per layer and per
  step is what the wrapper adds (DTensor dispatch, hooks, gradient bookkeeping).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from plait.config import RunConfig, TrainSpec
from plait.facts.stack import STACKS
from plait.facts.weight_passes import WeightPasses, end_gradient_bytes, end_passes, layer_gradient_bytes, layer_passes
from plait.layout import Layout
from plait.models.init import init_weights
from plait.models.spec import ModelSpec, model_spec
from plait.models.transformer import Transformer
from plait.parallel.context import average_over_context, context_shard
from plait.parallel.cross_entropy import cross_entropy
from plait.parallel.grad_norm import clip_grad_norm
from plait.parallel.optimizer import build_optimizer
from plait.plan.compute import LayerTimes, head_times, layer_times
from plait.hardware import Hardware, HostOverhead, KernelScale
from plait.plan.least_squares import relative_least_squares
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from plait.topology import Topology, build_topology
from plait.train.loop import autocast, parallelize_run, train_step

# Each family's probe attention as its published models have it: Llama's grouped-query (one kv-head
# here), GPT-2's one kv-head per query head (model_spec's default).
PROBE_KV_HEADS = {"gpt2": None, "llama": 1}
FAMILIES = tuple(PROBE_KV_HEADS)
PROBE_LAYERS = (1, 4)
PROBE_SHAPE = {"hidden": 64, "heads": 2, "vocab": 16, "seq_len": 8}  # kernels of a few microseconds


def no_sync() -> None:
    """A CPU's kernels are done when the call returns."""


def interleaved_medians(probes: dict[str, Callable[[], object]], rounds: int = 15, min_time: float = 0.02,
                        synchronize: Callable[[], None] = no_sync) -> dict[str, float]:
    """Median seconds per call of each probe, the probes taking turns so that a neighbour's burst
    of load falls on all of them alike rather than on one. On a GPU, whose host queues kernels
    ahead, ``synchronize`` waits for the device after each batch of calls, the batches doubling
    (so the host never queues more than the device has done, as it would a thousand launches)."""
    for fn in probes.values():
        fn()
    synchronize()
    samples: dict[str, list[float]] = {name: [] for name in probes}
    for _ in range(rounds):
        for name, fn in probes.items():
            count, batch, start = 0, 1, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < min_time or count == 0:
                for _ in range(batch):
                    fn()
                count += batch
                synchronize()
                batch = batch if synchronize is no_sync else 2 * batch
            samples[name].append(elapsed / count)
    return {name: statistics.median(values) for name, values in samples.items()}


CPU = torch.device("cpu")


@dataclass(frozen=True)
class ProbeSizes:
    """Where calibrate's probes run and how large they are: kernels of milliseconds a layer on the
    device (a CPU core's defaults; plait.calibrate.gpu has a GPU's)."""

    device: torch.device = CPU
    working_shape: dict[str, int] = field(default_factory=lambda: {"hidden": 256, "heads": 4, "vocab": 16, "seq_len": 64})
    working_micro_batch: int = 4
    optimizer_sets: dict[str, list[tuple[int, ...]]] = field(default_factory=lambda: {
        "many small": [(64, 64)] * 48 + [(64,)] * 48,
        "few large": [(1024, 1024)] * 2 + [(1024,)] * 2,
        "mixed": [(512, 512)] * 8 + [(512,)] * 8,
    })
    # plait's blockwise attention probes (plait.calibrate.machine.measure_block_attention): (heads,
    # queries, keys, head dim, causal), from a ring step's score block at a short sequence to one at
    # 8k tokens over cp 4.
    block_shapes: tuple[tuple[int, int, int, int, bool], ...] = (
        (4, 256, 256, 32, False), (4, 512, 512, 64, False), (4, 512, 512, 64, True), (4, 1024, 1024, 64, False))

    @property
    def synchronize(self) -> Callable[[], None]:
        """What waits for the device's queued kernels: nothing on a CPU."""
        if self.device.type == "cuda":
            return lambda: torch.cuda.synchronize(self.device)
        return no_sync

    def medians(self, probes: dict[str, Callable[[], object]], rounds: int = 15, min_time: float = 0.02) -> dict[str, float]:
        return interleaved_medians(probes, rounds, min_time, self.synchronize)


CPU_SIZES = ProbeSizes()


def probe_spec(family: str, layers: int) -> ModelSpec:
    return model_spec(None, family=family, layers=layers, kv_heads=PROBE_KV_HEADS[family], **PROBE_SHAPE)


def fit_host_overhead(t: dict[str, float], layer: LayerTimes, head: LayerTimes) -> HostOverhead:
    """The overhead that makes the kernel model's ``layer`` and ``head`` times of the probe add up
    to the measured seconds ``t`` ("forward1": one-layer forward, "both4": four-layer forward
    and backward, ...)."""
    few, many = PROBE_LAYERS
    forward_per_layer = (t[f"forward{many}"] - t[f"forward{few}"]) / (many - few)
    backward_per_layer = (t[f"both{many}"] - t[f"both{few}"]) / (many - few) - forward_per_layer
    backward_few = t[f"both{few}"] - t[f"forward{few}"]
    return HostOverhead(
        layer_forward=max(0.0, forward_per_layer - layer.forward),
        layer_backward=max(0.0, backward_per_layer - layer.backward),
        model_forward=max(0.0, t[f"forward{few}"] - few * forward_per_layer - head.forward),
        model_backward=max(0.0, backward_few - few * backward_per_layer - head.backward),
    )


def _model_probes(spec_of: Callable[[int], ModelSpec], micro_batch: int, precision: str,
                  device: torch.device = CPU) -> dict[str, Callable[[], object]]:
    """Forward ("forward1") and forward + backward ("both1") of plait's model, as trained (its
    seeded weights: default initialisation drives a backward into denormals, several times
    slower; bf16 under autocast), with each of PROBE_LAYERS layers."""
    probes = {}
    for layers in PROBE_LAYERS:
        spec = spec_of(layers)
        model = Transformer(spec)
        init_weights(model, spec, seed=0)
        model.to(device)
        tokens = torch.randint(0, spec.vocab, (micro_batch, spec.seq_len), generator=torch.Generator().manual_seed(0)).to(device)

        def loss(model=model, tokens=tokens) -> torch.Tensor:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                return cross_entropy(model(tokens), tokens)

        probes[f"forward{layers}"] = loss
        probes[f"both{layers}"] = lambda loss=loss: loss().backward()
    return probes


def kernel_model(profile: Hardware) -> Hardware:
    """``profile`` with its kernels alone: no host overhead and no layer scale, the baseline both
    are fitted against."""
    return replace(profile, host_overhead={}, layer_kernel_scale={}, host_runs_ahead=False)


def measure_host_overhead(profile: Hardware, precision: str, sizes: ProbeSizes = CPU_SIZES) -> dict[str, HostOverhead]:
    """Per family: the host seconds per layer and per model pass that the kernel model misses. A host
    that runs ahead of its device (a GPU's) works while the kernels run, so at this size, where the
    kernels are the shorter, what is measured is the host's alone."""
    out = {}
    for family in FAMILIES:
        t = sizes.medians(_model_probes(lambda layers: probe_spec(family, layers), 1, precision, sizes.device))
        out[family] = fit_host_overhead(t, *host_probe_kernels(profile, family, precision))
    return out


def host_probe_kernels(profile: Hardware, family: str, precision: str) -> tuple[LayerTimes, LayerTimes]:
    """The kernel time the host-overhead fit takes off the probe's layer and head: the kernel
    model's where the host is the device, none where the host runs ahead of it (its kernels run
    under the host's time, the longer at the probe's size)."""
    if profile.host_runs_ahead:
        return LayerTimes(0.0, 0.0, 0.0, 0.0), LayerTimes(0.0, 0.0, 0.0, 0.0)
    spec, kernels_only = probe_spec(family, PROBE_LAYERS[0]), kernel_model(profile)
    return (layer_times(spec, kernels_only, Layout(), 1, precision, STACKS["plait"], probe_passes(spec, precision)),
            probe_head(spec, kernels_only, precision))


# A probe's one rank, its every call accumulating once: two micro-batches' step accumulates once.
ACCUMULATING = Layout(microbatches=2)


def probe_passes(spec: ModelSpec, precision: str) -> WeightPasses:
    """The weight passes of one of a probe's layers (plait.facts.weight_passes): its fp32 weights cast
    under bf16 autocast, and its gradients accumulated in every call's backward, as the probes never
    clear them (past the first call, which the timing leaves out)."""
    passes = layer_passes(spec, Layout(), precision, STACKS["plait"])
    return passes._replace(backward=passes.backward + layer_gradient_bytes(spec, ACCUMULATING, precision, STACKS["plait"]))


def probe_head(spec: ModelSpec, profile: Hardware, precision: str) -> LayerTimes:
    """The probe's head as the kernel model times it, with the passes over its embedding and output
    projection (their gradients accumulated in every call, as ``probe_passes``)."""
    head = head_times(spec, profile, precision, 1, 1, 1)
    passes = end_passes(spec, Layout(), precision, STACKS["plait"], True, True)
    accumulated = end_gradient_bytes(spec, ACCUMULATING, precision, STACKS["plait"], True, True)
    rate = profile.memory_gbps * 1e9
    return replace(head, forward=head.forward + passes.forward / rate,
                   backward_weight=head.backward_weight + (passes.backward + accumulated) / rate)


def working_spec(family: str, layers: int, sizes: ProbeSizes = CPU_SIZES) -> ModelSpec:
    return model_spec(None, family=family, layers=layers, kv_heads=PROBE_KV_HEADS[family], **sizes.working_shape)


def fit_layer_kernel_scale(t: dict[str, float], kernels: LayerTimes, host: HostOverhead) -> KernelScale:
    """The factor by which a layer's kernels (``kernels``: the kernel model's times, no host)
    take longer than modelled, forward and backward, once the ``host`` overhead per layer is
    taken from the measured per-layer seconds (keys as fit_host_overhead's)."""
    few, many = PROBE_LAYERS
    forward = (t[f"forward{many}"] - t[f"forward{few}"]) / (many - few)
    backward = (t[f"both{many}"] - t[f"both{few}"]) / (many - few) - forward
    return KernelScale(forward=max(forward - host.layer_forward, 0.0) / kernels.forward,
                       backward=max(backward - host.layer_backward, 0.0) / kernels.backward)


def working_layer_probes(precision: str, sizes: ProbeSizes = CPU_SIZES) -> dict[str, Callable[[], object]]:
    """Plait's model at the working size, per family ("gpt2/forward1", ...): to be timed in one
    interleaved pass with the matmuls whose fitted peak the kernel model then uses, so that a slow
    minute of a shared host falls on both and cancels in the scale."""
    return {f"{family}/{key}": probe
            for family in FAMILIES
            for key, probe in _model_probes(lambda layers: working_spec(family, layers, sizes), sizes.working_micro_batch,
                                            precision, sizes.device).items()}


def layer_kernel_scales(times: dict[str, float], profile: Hardware, precision: str,
                        sizes: ProbeSizes = CPU_SIZES) -> dict[str, KernelScale]:
    """Per family: the working layers' seconds (``times``, keyed as working_layer_probes) against
    the kernel model of ``profile``, with its host overhead per layer taken off first."""
    kernels_only = kernel_model(profile)
    out = {}
    for family in FAMILIES:
        t = {key.split("/")[1]: seconds for key, seconds in times.items() if key.startswith(f"{family}/")}
        spec = working_spec(family, 1, sizes)
        layer = layer_times(spec, kernels_only, Layout(), sizes.working_micro_batch, precision, STACKS["plait"],
                            probe_passes(spec, precision))
        # (a host that runs ahead of its GPU spends its time under the working layers' kernels)
        host = HostOverhead() if profile.host_runs_ahead else profile.host_overhead.get(family, HostOverhead())
        out[family] = fit_layer_kernel_scale(t, layer, host)
    return out


# Two ranks each, fitted in this order; plait.plan.costs.parallel_styles names what a layout uses.
PARALLEL_STYLES = {
    "zero0": Layout(dp=2), "zero1": Layout(dp=2, zero=1), "zero2": Layout(dp=2, zero=2), "zero3": Layout(dp=2, zero=3),
    "tp": Layout(tp=2), "sp": Layout(tp=2, sp=True), "cp": Layout(cp=2),
}


def _timed_steps(family: str, layers: int, topology: Topology, precision: str, rounds: int = 7, calls: int = 3) -> float:
    """Seconds of one ``plait train`` step of the probe model on ``topology``: the median of
    ``rounds`` rounds, as a training run's step time is read (every rank runs the same fixed
    number of steps, as their collectives must match)."""
    device = torch.device("cpu")
    config = RunConfig(probe_spec(family, layers), topology.layout, TrainSpec(global_batch=topology.layout.dp, precision=precision))
    parallel = parallelize_run(config, topology)
    tokens = torch.randint(0, config.model.vocab, (1, config.model.seq_len), generator=torch.Generator().manual_seed(0))
    inputs, targets, positions = context_shard(tokens, tokens, topology)

    def step() -> None:
        loss, _ = train_step(parallel, [(inputs, targets)], config.train.grad_clip, lambda: autocast(config, device),
                             positions)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=topology.group("dp"))
        average_over_context(loss, topology)
        loss.item()

    step()
    runs = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        runs.append((time.perf_counter() - start) / calls)
    return statistics.median(runs)


def fit_wrapper_overhead(measured: dict[int, float], predicted: dict[int, float], base: HostOverhead) -> HostOverhead:
    """Per layer and per step, what a wrapper's measured steps (by layer count) add to the
    predicted ones; the per-layer part split between forward and backward as ``base`` is."""
    few, many = PROBE_LAYERS
    per_layer = max(((measured[many] - measured[few]) - (predicted[many] - predicted[few])) / (many - few), 0.0)
    per_step = max(measured[few] - predicted[few] - few * per_layer, 0.0)
    forward_share = base.layer_forward / max(base.layer_forward + base.layer_backward, 1e-12)
    return HostOverhead(layer_forward=per_layer * forward_share, layer_backward=per_layer * (1 - forward_share), step=per_step)


def measure_wrapper_overhead(profile: Hardware, precision: str, passes: int = 3) -> dict[str, HostOverhead]:
    """Run on both ranks of a two-rank group: per family and parallel style, the host seconds per
    layer and per step by which plait's step there exceeds the planner's prediction of it with the
    single-device host overhead (``profile``'s) and the styles fitted before it: a cp probe's step
    runs DDP over its cp ranks too (they reduce their gradients as dp ranks do), which the ``zero0``
    style already holds. Every probe is timed in ``passes`` passes over all of them, and its median
    taken, so that a burst of steal time spoils one reading, not a fit."""
    topologies = {style: build_topology(layout, torch.device("cpu")) for style, layout in PARALLEL_STYLES.items()}
    probes = [(style, family, layers) for style in PARALLEL_STYLES for family in FAMILIES for layers in PROBE_LAYERS]
    readings: dict[tuple, list[float]] = {probe: [] for probe in probes}
    for _ in range(passes):
        for style, family, layers in probes:
            readings[style, family, layers].append(_timed_steps(family, layers, topologies[style], precision))
    out = {}
    for style, layout in PARALLEL_STYLES.items():
        for family in FAMILIES:
            measured = {n: statistics.median(readings[style, family, n]) for n in PROBE_LAYERS}
            fitted = replace(profile, host_overhead={**profile.host_overhead, **out})
            predicted = {n: evaluate(Workload(probe_spec(family, n), layout.dp, precision, STACKS["plait"]), fitted,
                                     layout.world_size, layout).step_time_s for n in PROBE_LAYERS}
            out[f"{family}/{style}"] = fit_wrapper_overhead(measured, predicted, profile.host_overhead[family])
    return out


class _Parameters(nn.Module):
    def __init__(self, shapes: list[tuple[int, ...]]):
        super().__init__()
        self.tensors = nn.ParameterList(nn.Parameter(torch.randn(shape) * 0.02) for shape in shapes)


def measure_optimizer(probe_sizes: ProbeSizes = CPU_SIZES) -> tuple[float, float, list[dict]]:
    """(seconds per parameter, seconds per tensor, the measured points) of plait's clipping and
    AdamW step, as ``plait train`` runs them after every step."""
    sets = probe_sizes.optimizer_sets
    probes, sizes = {}, {}
    for name, shapes in sets.items():
        module = _Parameters(shapes).to(probe_sizes.device)
        optimizer = build_optimizer(module, TrainSpec().lr, TrainSpec().weight_decay)
        grads = [torch.randn_like(p) * 1e-3 for p in module.parameters()]

        def step(module=module, optimizer=optimizer, grads=grads) -> None:
            for p, g in zip(module.parameters(), grads):
                p.grad = g
            clip_grad_norm(grads, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        probes[name] = step
        sizes[name] = (sum(p.numel() for p in module.parameters()), len(shapes))
    times = probe_sizes.medians(probes, rounds=7, min_time=0.05)
    per_parameter, per_tensor = relative_least_squares([tuple(map(float, sizes[n])) for n in sets], [times[n] for n in sets])
    points = [{"set": n, "parameters": sizes[n][0], "tensors": sizes[n][1], "measured_s": times[n],
               "predicted_s": sizes[n][0] * per_parameter + sizes[n][1] * per_tensor} for n in sets]
    return max(per_parameter, 0.0), max(per_tensor, 0.0), points
