"""The training loop, run by every rank over an already-initialised process group.

Order of construction, as in torchtitan: build the single-device model on the meta device →
``parallelize`` (every parallelism, applied from outside; the rank's own part of each weight made
real and filled; the optimizer) → (resume) → steps. Each step is ``train_step``: forward and backward (a plain loop over the
micro-batches, or the pipeline's schedule), the gradients finished for the layout, clipping, the
optimizer step.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function
from tqdm import tqdm

from plait.config import RunConfig, TrainSpec, config_toml
from plait.interop.hf import hf_weight_source
from plait.models.init import WeightSource, seeded_source
from plait.models.transformer import Transformer
from plait.observe.model_state import ModelStateMeter
from plait.observe.progress import Progress
from plait.observe.run_files import CONFIG_FILE, PROFILE_DIR, MetricsLog, draw_loss, write_run_trace
from plait.observe.step_trace import StepTracer
from plait.observe.summary import write_summary
from plait.observe.tensorboard import TensorBoardLog
from plait.parallel.context import average_over_context, context_shard
from plait.parallel.cross_entropy import cross_entropy
from plait.parallel.gradients import clip_gradients, finish_gradients, gradient_sync
from plait.parallel.materialize import materialize
from plait.parallel.parallelize import Parallelized, parallelize
from plait.parallel.sharded_adamw import fp32_masters, gradients_of
from plait.tokenizer import TOKENIZER_FILE
from plait.topology import Topology
from plait.train.checkpoint import latest_checkpoint, load_checkpoint, weights_are_finite
from plait.train.checkpoint_record import run_identity
from plait.train.checkpoint_writer import CheckpointWriter
from plait.train.data import BatchSource, training_tokens
from plait.train.evaluation import split_for_evaluation
from plait.train.optim import lr_scheduler

MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]
Spans = Callable[..., contextlib.AbstractContextManager]  # span(name, **args): a traced compute span


def no_spans(name: str, **args) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


class NonFiniteLoss(RuntimeError):
    """A step's global gradient norm or loss is NaN or infinite: the run stops, nothing of that step is kept."""


@dataclass
class TrainResult:
    """What one rank saw: the global loss of every step it ran, and per-step timings."""

    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    observed: list[bool] = field(default_factory=list)  # per step: traced or profiled (StepTracer.observes)
    first_step: int = 0
    model: nn.Module | None = None
    model_state_bytes: dict[str, int] = field(default_factory=dict)
    pipeline: dict[str, float] = field(default_factory=dict)  # measured and theoretical bubble, with --pp
    traces: list[dict] | None = None  # on rank 0: every rank's traced steps (plait.observe.step_trace)
    summary: dict | None = None


def wants_final_checkpoint(train: TrainSpec, first_step: int) -> bool:
    """A checkpoint after the last step: on by default, unless no step ran or --checkpoint-every saved it."""
    ran = first_step < train.steps
    saved = train.checkpoint_every and train.steps % train.checkpoint_every == 0
    return train.final_checkpoint and ran and not saved


def weight_source(config: RunConfig) -> WeightSource:
    """Where the run's initial weights come from: --init-from's folder, else the seed (identical
    under every layout, a rank reading or generating only the part it keeps)."""
    if config.train.init_from:
        return hf_weight_source(Path(config.train.init_from), config.model)
    return seeded_source(config.model, config.train.seed)


def build_model(config: RunConfig, device: torch.device) -> nn.Module:
    """The whole single-device model with the run's initial weights (the single process's reference)."""
    with torch.device("meta"):
        model = Transformer(config.model)
    return materialize(model, weight_source(config), device)


def parallelize_run(config: RunConfig, topology: Topology) -> Parallelized:
    """The run's model built on the meta device and ``parallelize``d with the run's weights,
    precision and optimizer settings: the rank allocates only what it keeps."""
    train = config.train
    with torch.device("meta"):
        model = Transformer(config.model)
    return parallelize(model, topology, train.precision, train.lr, train.weight_decay, weight_source(config))


def autocast(config: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    if config.train.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def forward_backward(parallel: Parallelized, micro_batches: MicroBatches, autocast: Callable,
                     positions: torch.Tensor | None, span: Spans = no_spans) -> torch.Tensor:
    """Accumulate the micro-batches' gradients, the data-parallel hooks reducing only with the last
    one (the reduce-scatters, FSDP2's and ZeRO-2's, with every one). Returns this rank's mean loss."""
    model, optimizer, device = parallel.model, parallel.optimizer, parallel.topology.device
    buckets = parallel.gradient_buckets
    local_loss = torch.zeros((), device=device)
    count = len(micro_batches)
    for index, (inputs, targets) in enumerate(micro_batches):
        sync = index == count - 1
        with record_function(f"plait.microbatch.{index}"), gradient_sync(model, optimizer, sync, buckets):
            # autocast wraps the forward alone, as PyTorch's AMP recipe has it: leaving it frees its
            # cache of bf16 weight casts (a 1B model's 2.5 GB, which recomputed blocks would otherwise
            # hold through the backward), and the backward's kernels take their dtypes from the
            # forward's graph (a recomputed block re-enters autocast by itself)
            with span("forward", microbatch=index), autocast():
                loss = cross_entropy(model(inputs.to(device), positions), targets, count)
            with span("backward", microbatch=index):
                loss.backward()
        local_loss += loss.detach()
    return local_loss


def train_step(parallel: Parallelized, micro_batches: MicroBatches, grad_clip: float, autocast: Callable,
               positions: torch.Tensor | None = None,
               laid_out: Callable[[], None] = lambda: None, span: Spans = no_spans,
               progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step: forward and backward, the gradients finished for the layout, clipping at
    ``grad_clip`` (0: none), the step. Returns (this rank's mean loss, global grad norm).

    ``autocast()`` gives the run's precision context; ``positions`` are those of the sequence slice
    this rank holds under context parallelism; ``laid_out`` is called after backward, once the
    gradients are laid out as their parameters, before they are reduced; ``span`` times the compute
    spans of a traced step; ``progress`` records the pipeline's actions for the stall watchdog."""
    if parallel.pipeline is not None:
        progress = progress or Progress()
        progress.phase("forward and backward")
        loss = parallel.pipeline.forward_backward(micro_batches, autocast, positions, progress)
    else:
        loss = forward_backward(parallel, micro_batches, autocast, positions, span)
    with span("gradient sync"):
        finish_gradients(parallel.model, parallel.optimizer, parallel.topology, parallel.reduction, laid_out)
    with span("optimizer"):
        max_norm = grad_clip if grad_clip > 0 else math.inf
        grad_norm = clip_gradients(parallel.model, parallel.optimizer, parallel.topology, parallel.reduction, max_norm)
        if not torch.isfinite(grad_norm):  # the global norm, the same on every rank: all stop before stepping
            parallel.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss(f"the gradient norm is {grad_norm.item()}")
        parallel.optimizer.step()
        parallel.optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm


def train(config: RunConfig, topology: Topology, run_dir: Path | None = None,
          resume_from: Path | None = None, progress: Progress | None = None) -> TrainResult:
    """Run ``config`` on this rank. With ``run_dir``, rank 0 writes the run files there; with --resume
    the run continues ``resume_from`` (default: the run dir's newest complete checkpoint). Each step's
    phases are recorded in ``progress``, which the stall watchdog reads."""
    progress = progress or Progress()
    train_spec, layout, device = config.train, config.layout, topology.device
    if train_spec.deterministic:
        torch.use_deterministic_algorithms(True)
    tokens = training_tokens(train_spec.data, config.model.vocab, config.model.seq_len)
    tokens, evaluator = split_for_evaluation(tokens, config)  # with --eval-every, training reads only the first part
    source = BatchSource(tokens, config.model.seq_len, train_spec.global_batch, train_spec.seed)

    parallel = parallelize_run(config, topology)
    model, optimizer, pipeline = parallel.model, parallel.optimizer, parallel.pipeline
    meter = ModelStateMeter(model, optimizer, lambda: gradients_of(optimizer), fp32_masters(optimizer),
                            parallel.unreduced_gradients)
    result = TrainResult(model=model, model_state_bytes=meter.held)
    if train_spec.resume and run_dir is not None and (checkpoint := resume_from or latest_checkpoint(run_dir)):
        result.first_step = load_checkpoint(checkpoint, model, optimizer)

    writes = run_dir is not None and topology.is_logging_rank
    log = MetricsLog(run_dir, result.first_step) if writes else None
    board = TensorBoardLog(run_dir) if writes and train_spec.tensorboard else None
    if writes:
        (run_dir / CONFIG_FILE).write_text(config_toml(config))
        if train_spec.tokenizer:  # kept so that plait sample decodes this run's tokens
            shutil.copyfile(train_spec.tokenizer, run_dir / TOKENIZER_FILE)
    writer = None if run_dir is None else CheckpointWriter(run_dir, run_identity(config), train_spec.keep_checkpoints,
                                                           train_spec.async_checkpoint)
    dp_rank, dp_size, dp_group = topology.coordinate("dp"), topology.size("dp"), topology.group("dp")
    tokens_per_step = train_spec.global_batch * config.model.seq_len
    steps = range(result.first_step, train_spec.steps)
    # A bar on a terminal; in a log file (not a terminal) a plain line every --log-every steps.
    writes_log_lines, on_terminal = topology.is_logging_rank, sys.stderr.isatty()
    bar = tqdm(steps, desc="train", unit="step", disable=not (writes_log_lines and on_terminal), dynamic_ncols=True)
    tracer = StepTracer(topology, train_spec.trace_every, result.first_step, train_spec.steps,
                        train_spec.profiled_steps, run_dir / PROFILE_DIR if run_dir is not None else None)
    schedule = lr_scheduler(optimizer, train_spec, result.first_step)
    span = progress.marking(tracer.span)
    try:
        for step in bar:
            started = time.perf_counter()
            progress.step(step, "data")
            with tracer.step(step):
                lr = schedule.get_last_lr()[0]
                inputs, targets = source.local_batch(step, dp_rank, dp_size)
                inputs, targets, positions = context_shard(inputs, targets, topology)
                micro = list(zip(inputs.chunk(layout.microbatches), targets.chunk(layout.microbatches)))
                try:
                    local_loss, grad_norm = train_step(parallel, micro, train_spec.grad_clip,
                                                       lambda: autocast(config, device), positions,
                                                       meter.before_reduction, span, progress)
                except NonFiniteLoss as error:
                    raise NonFiniteLoss(f"step {step}: {error}, so the step was not taken and nothing of it was "
                                        "logged or saved; resume from an earlier checkpoint with a lower --lr, or "
                                        "check the data") from None
                schedule.step()
                if pipeline is not None:
                    tracer.add_actions(pipeline.last_step_spans)
                progress.phase("loss all-reduce (dp)")
                dist.all_reduce(local_loss, op=dist.ReduceOp.AVG, group=dp_group)
                average_over_context(local_loss, topology)
                loss = local_loss.item()
                if not math.isfinite(loss):  # the same global loss on every rank, so every rank stops here
                    raise NonFiniteLoss(f"step {step}: the loss is {loss}, so nothing of the step was logged or saved; "
                                        "resume from an earlier checkpoint with a lower --lr, or check the data")
            elapsed = time.perf_counter() - started
            result.losses.append(loss)
            result.step_times.append(elapsed)
            result.observed.append(tracer.observes(step))
            bar.set_postfix(loss=f"{loss:.3f}")
            evaluated = {}
            if evaluator is not None and ((step + 1) % train_spec.eval_every == 0 or step == train_spec.steps - 1):
                progress.phase("eval")
                evaluated["eval_loss"] = evaluator.evaluate(parallel, lambda: autocast(config, device))
            row = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm.item(),
                   "step_time_s": elapsed, "tokens_per_s": tokens_per_step / elapsed, **evaluated}
            if log is not None:
                log.append(row)
            if board is not None:
                board.add_step(row)
            last = step == train_spec.steps - 1
            if writes_log_lines and not on_terminal and (step % train_spec.log_every == 0 or last):
                held_out = f", eval loss {evaluated['eval_loss']:.4f}" if evaluated else ""
                print(f"step {step}/{train_spec.steps}: loss {loss:.4f}{held_out}, lr {lr:.3g}, grad norm "
                      f"{grad_norm.item():.3g}, {tokens_per_step / elapsed:,.0f} tokens/s", flush=True)
            if run_dir is not None and train_spec.checkpoint_every and (step + 1) % train_spec.checkpoint_every == 0:
                if not weights_are_finite(model):  # the last checkpoint kept stays one training can go on from
                    raise NonFiniteLoss(f"step {step}: the weights are not finite after the step, so it was not saved; "
                                        "resume from an earlier checkpoint with a lower --lr")
                progress.phase("checkpoint")
                writer.save(step + 1, model, optimizer)
        bar.close()
        progress.phase("final checkpoint")
        if run_dir is not None and wants_final_checkpoint(train_spec, result.first_step):
            if not weights_are_finite(model):
                raise NonFiniteLoss(f"step {train_spec.steps - 1}: the weights are not finite after the step, so it "
                                    "was not saved; resume from an earlier checkpoint with a lower --lr")
            writer.save(train_spec.steps, model, optimizer)
    except NonFiniteLoss:  # raised on every rank at the same step: a checkpoint still being written completes
        if writer is not None:
            writer.finish()
        raise
    if writer is not None:
        writer.finish()
    progress.phase("gathering timelines and traces")
    if pipeline is not None and result.losses:
        result.pipeline = pipeline.measure().figures
    result.traces = tracer.gather()
    if writes and result.traces:
        write_run_trace(run_dir, result.traces, layout, result.pipeline.get("bubble_fraction"))
    progress.phase("summary")
    if run_dir is not None:
        result.summary = write_summary(run_dir, config, topology, result)
        if writes:
            draw_loss(run_dir)
    if board is not None:
        board.close(result.summary, train_spec.steps - 1)
    return result
