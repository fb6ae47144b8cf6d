"""Per-rank measurements the pool runs: collective bytes and saved activations of one layer."""

from __future__ import annotations

from dataclasses import replace

import torch

from plait.config import RunConfig
from plait.parallel.context import context_shard
from plait.parallel.cross_entropy import cross_entropy
from plait.parallel.gradients import finish_gradients, gradient_reduction
from plait.parallel.optimizer import build_optimizer
from plait.parallel.parallelize import apply_within_stage
from plait.topology import build_topology
from plait.train.loop import autocast, build_model
from tests.measure_collectives import CollectiveBytes
from tests.measure_saved import SavedBytes

CPU = torch.device("cpu")


def _one_step(config: RunConfig, layers: int, topology) -> tuple[CollectiveBytes, SavedBytes]:
    """Forward and backward of one batch through a ``layers``-deep model, measured."""
    config = replace(config, model=replace(config.model, layers=layers))
    model = apply_within_stage(build_model(config, CPU), topology)
    generator = torch.Generator().manual_seed(0)
    shape = (config.train.global_batch, config.model.seq_len)
    tokens = torch.randint(0, config.model.vocab, shape, generator=generator)
    inputs, targets, positions = context_shard(tokens, tokens.roll(-1, dims=1), topology)
    saved = SavedBytes(model, model.layers["0"])
    with CollectiveBytes() as comm, saved.recording():
        with autocast(config, CPU):  # as the training loop runs it: bf16 autocast over fp32 weights, the forward
            loss = cross_entropy(model(inputs, positions), targets)
        loss.backward()
        finish_gradients(model, build_optimizer(model, 1e-3, 0.0), topology, gradient_reduction(topology))
    return comm, saved


def layer_costs(config: RunConfig) -> dict:
    """Per layer and step: bytes handed to each collective, calls of each, and bytes saved for backward;
    and per step, the bytes handed to each collective outside the layers (embedding, head, the
    gradient sums of weights ranks replicate there).

    The collectives of one layer are those of a 2-layer model less those of a 1-layer model; those
    outside the layers are the 1-layer model's less one layer's."""
    topology = build_topology(config.layout, CPU)
    one, saved = _one_step(config, 1, topology)
    two, _ = _one_step(config, 2, topology)
    return {
        "bytes": {name: two.bytes[name] - one.bytes[name] for name in two.bytes if two.bytes[name] != one.bytes[name]},
        "calls": {name: two.calls[name] - one.calls[name] for name in two.calls if two.calls[name] != one.calls[name]},
        "saved": saved.total,
        "outside": {name: count for name in two.bytes if (count := 2 * one.bytes[name] - two.bytes[name])},
    }


def saved_activation_bytes(config: RunConfig) -> list[int]:
    """Bytes each block keeps for backward in one forward and backward, under the run's precision,
    on the model as a stage of ``config``'s layout holds it: tensor and context parallelism, then
    (without pp) data parallelism and ZeRO, whose bf16 stages 1 and 2 hold bf16 weights (on a
    pipeline stage too)."""
    from plait.parallel.data_parallel.data import apply_data_parallel, hold_weights

    topology = build_topology(config.layout, CPU)
    model = apply_within_stage(build_model(config, CPU), topology)
    if config.layout.pp == 1:
        model = apply_data_parallel(model, topology, config.train.precision)
    else:
        hold_weights(model, topology, config.train.precision)
    inner = getattr(model, "module", model)  # DDP wraps the model
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.model.vocab, (config.train.global_batch // config.layout.dp, config.model.seq_len),
                           generator=generator)
    inputs, targets, positions = context_shard(tokens, tokens.roll(-1, dims=1), topology)
    saved = SavedBytes(model, *inner.layers.values())
    with saved.recording():
        with autocast(config, CPU):  # the forward, as the training loop runs it
            loss = cross_entropy(model(inputs, positions), targets)
        loss.backward()
    return saved.totals


def autocast_during_backward(config: RunConfig) -> list[bool]:
    """Whether autocast was on as each parameter's gradient arrived, over one ``train_step`` of ``config``
    (no pipeline) with its precision's autocast."""
    from plait.train.loop import parallelize_run, train_step

    topology = build_topology(config.layout, CPU)
    parallel = parallelize_run(config, topology)
    states: list[bool] = []
    for param in parallel.model.parameters():
        param.register_hook(lambda grad: states.append(torch.is_autocast_enabled("cpu")))
    tokens = torch.randint(0, config.model.vocab, (config.train.global_batch // config.layout.dp, config.model.seq_len),
                           generator=torch.Generator().manual_seed(0))
    train_step(parallel, [(tokens, tokens.roll(-1, dims=1))], config.train.grad_clip, lambda: autocast(config, CPU))
    return states


def held_model_state(config: RunConfig) -> dict:
    """This rank's measured model-state bytes after training ``config``, with its pp, dp and cp coordinates."""
    from plait.train.loop import train

    topology = build_topology(config.layout, CPU)
    result = train(config, topology)
    return {"held": dict(result.model_state_bytes), "pp": topology.coordinate("pp"), "dp": topology.coordinate("dp"),
            "cp": topology.coordinate("cp")}


def offloaded_activation_bytes(config: RunConfig) -> dict:
    """Under ``--offload-activations``: bytes each block's forward copied to host memory, as
    ``saved_activation_bytes`` runs the model, and the saved tensors the hooks left on the device
    (other than parameters: they stay)."""
    from unittest import mock

    from plait.parallel import offload
    from plait.parallel.data_parallel.data import apply_data_parallel

    topology = build_topology(config.layout, CPU)
    model = apply_within_stage(build_model(config, CPU), topology)
    if config.layout.pp == 1:
        model = apply_data_parallel(model, topology, config.train.precision)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.model.vocab, (config.train.global_batch // config.layout.dp, config.model.seq_len),
                           generator=generator)
    inputs, targets, positions = context_shard(tokens, tokens.roll(-1, dims=1), topology)
    forwards, left = [], []

    def watched() -> offload.BlockOffload:
        hooks = offload.BlockOffload()
        pack = hooks.pack

        def noting_what_stays(tensor: torch.Tensor):
            packed = pack(tensor)
            if packed is tensor and not offload.is_parameter(tensor):
                left.append(tensor)
            return packed

        hooks.pack = noting_what_stays
        forwards.append(hooks)
        return hooks

    with mock.patch.object(offload, "new_block_offload", watched), autocast(config, CPU):
        cross_entropy(model(inputs, positions), targets).backward()
    return {"moved": [hooks.moved_bytes() for hooks in forwards], "left": len(left)}
