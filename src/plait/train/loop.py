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
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function
from tqdm import tqdm

from plait.config import RunConfig, TrainSpec, config_toml, resolved_tables
from plait.interop.hf import hf_weight_source
from plait.models.init import WeightSource, seeded_source
from plait.models.transformer import Transformer
from plait.observe.model_state import ModelStateMeter
from plait.progress import Progress
from plait.observe.run_files import CONFIG_FILE, PROFILE_DIR, MetricsLog, draw_loss, write_run_trace
from plait.observe.step_trace import StepTracer
from plait.observe.summary import write_summary
from plait.observe.tensorboard import TensorBoardLog
from plait.observe.wandb_log import WandbLog
from plait.parallel.context import average_over_context, context_shard
from plait.parallel.cross_entropy import TrainingLoss
from plait.parallel.data_parallel.sharded_adamw import fp32_masters, gradients_of
from plait.parallel.gradients import (
    clip_gradients, finish_gradients, gradient_groups, gradient_norm, gradient_sync, local_group_squares,
)
from plait.parallel.materialize import materialize
from plait.parallel.parallelize import Parallelized, parallelize
from plait.tokenizer import TOKENIZER_FILE
from plait.topology import Topology
from plait.train.checkpoint import latest_checkpoint, load_checkpoint, weights_are_finite
from plait.train.checkpoint_record import run_identity
from plait.train.checkpoint_writer import CheckpointWriter
from plait.train.data import BatchSource, training_tokens
from plait.train.evaluation import Evaluator, split_for_evaluation
from plait.train.optim import lr_scheduler
from plait.observe.spikes import NOTABLE_FACTOR, SpikeGuard, non_finite_groups, write_non_finite

MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]
Spans = Callable[..., contextlib.AbstractContextManager]  # span(name, **args): a traced compute span


def no_spans(name: str, **args) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class StepWatchers:
    """What observes a step without changing it: ``laid_out`` is called after backward, once the
    gradients are laid out as their parameters, before they are reduced; ``span`` times the compute
    spans of a traced step; ``progress`` records the pipeline's actions for the stall watchdog."""

    laid_out: Callable[[], None] = _nothing
    span: Spans = no_spans
    progress: Progress = field(default_factory=Progress)


class NonFiniteLoss(RuntimeError):
    """A step's global gradient norm or loss is NaN or infinite: the run stops, nothing of that step is
    kept. ``local_squares``: this rank's share of each group's squared gradient norm (``GradientNorms``),
    where the norm was the cause."""

    def __init__(self, message: str, local_squares: torch.Tensor | None = None):
        super().__init__(message)
        self.local_squares = local_squares


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
    skipped_steps: list[int] = field(default_factory=list)  # whose update --skip-spikes skipped
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
    parallel = parallelize(model, topology, train.precision, train.lr, train.weight_decay, weight_source(config))
    return replace(parallel, loss=TrainingLoss(train.z_loss))


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
                loss = parallel.loss(model(inputs.to(device), positions), targets, count)
            with span("backward", microbatch=index):
                loss.backward()
        local_loss += loss.detach()
    return local_loss


def _never(norm: float) -> bool:
    return False


@dataclass(frozen=True)
class NormPolicy:
    """What a step does given its global gradient norm (the same on every rank, so every rank alike):
    whether it skips the update (``--skip-spikes``) and whether it measures each group's norm, for a
    record (``local_group_squares``: a pass over the gradients, so only where a step is recorded)."""

    skips: Callable[[float], bool] = _never
    records: Callable[[float], bool] = _never


@dataclass(frozen=True)
class GradientNorms:
    """A step's global gradient norm before clipping (the same on every rank), this rank's share of
    each of ``gradient_groups``' squared norms where the step records them (``local_group_squares``:
    summed over the ranks, the groups' squares; else None), and whether the update was skipped as a
    spike (``--skip-spikes``)."""

    total: torch.Tensor
    local_squares: torch.Tensor | None
    skipped: bool = False

    def by_group(self, layers: int) -> dict[str, float]:
        """Collective over every rank: each group's norm."""
        return group_norms(self.local_squares, layers)


def group_norms(local_squares: torch.Tensor, layers: int) -> dict[str, float]:
    """Collective over every rank: each of ``gradient_groups(layers)``' norms from the ranks' shares."""
    squares = local_squares.clone()
    dist.all_reduce(squares)
    return dict(zip(gradient_groups(layers), squares.sqrt().tolist()))


def train_step(parallel: Parallelized, micro_batches: MicroBatches, grad_clip: float, autocast: Callable,
               positions: torch.Tensor | None = None,
               watchers: StepWatchers | None = None,
               policy: NormPolicy | None = None) -> tuple[torch.Tensor, GradientNorms]:
    """One optimizer step: forward and backward, the gradients finished for the layout, clipping at
    ``grad_clip`` (0: none), the step unless ``policy`` skips it, under ``watchers``. Returns (this
    rank's mean loss, the gradient norms).

    ``autocast()`` gives the run's precision context; ``positions`` are those of the sequence slice
    this rank holds under context parallelism."""
    watchers = watchers or StepWatchers()
    laid_out, span, progress = watchers.laid_out, watchers.span, watchers.progress
    if parallel.pipeline is not None:
        progress.phase("forward and backward")
        loss = parallel.pipeline.forward_backward(micro_batches, autocast, positions, progress, parallel.loss)
    else:
        loss = forward_backward(parallel, micro_batches, autocast, positions, span)
    with span("gradient sync"):
        finish_gradients(parallel.model, parallel.optimizer, parallel.topology, parallel.reduction, laid_out)
    with span("optimizer"):
        max_norm = grad_clip if grad_clip > 0 else math.inf
        policy = policy or NormPolicy()
        total = gradient_norm(parallel.model, parallel.optimizer, parallel.topology, parallel.reduction)
        value = total.item()

        def squares() -> torch.Tensor:
            return local_group_squares(parallel.model, parallel.optimizer, parallel.topology, parallel.reduction)

        if not math.isfinite(value):  # the global norm, the same on every rank: all stop before stepping
            where = squares()
            parallel.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss(f"the gradient norm is {value}", where)
        recorded = squares() if policy.records(value) else None
        clip_gradients(parallel.optimizer, max_norm, total)
        skipped = policy.skips(value)
        if not skipped:
            parallel.optimizer.step()
        parallel.optimizer.zero_grad(set_to_none=True)
    return loss, GradientNorms(total, recorded, skipped)


@dataclass
class RankRun:
    """What one rank's run holds from its start to its end: the parallelized model and its data, the
    files rank 0 writes (``log``, None elsewhere; ``loggers``, TensorBoard's and W&B's, none elsewhere),
    the checkpoint writer (None without a run directory), the tracer, the learning-rate schedule and the
    result so far."""

    config: RunConfig
    topology: Topology
    run_dir: Path | None
    parallel: Parallelized
    source: BatchSource
    evaluator: Evaluator | None
    meter: ModelStateMeter
    result: TrainResult
    log: MetricsLog | None
    loggers: list[TensorBoardLog | WandbLog]
    writer: CheckpointWriter | None
    tracer: StepTracer
    schedule: torch.optim.lr_scheduler.LRScheduler
    progress: Progress
    spikes: SpikeGuard


def train(config: RunConfig, topology: Topology, run_dir: Path | None = None,
          resume_from: Path | None = None, progress: Progress | None = None) -> TrainResult:
    """Run ``config`` on this rank. With ``run_dir``, rank 0 writes the run files there; with --resume
    the run continues ``resume_from`` (default: the run dir's newest complete checkpoint). Each step's
    phases are recorded in ``progress``, which the stall watchdog reads."""
    run = start_rank_run(config, topology, run_dir, resume_from, progress or Progress())
    # A bar on a terminal; in a log file (not a terminal) a plain line every --log-every steps. The bar
    # goes to standard output, which the launcher leaves to the terminal (it reads torchrun's stderr).
    on_terminal = sys.stdout.isatty()
    bar = tqdm(range(run.result.first_step, config.train.steps), desc="train", unit="step", file=sys.stdout,
               disable=not (topology.is_logging_rank and on_terminal), dynamic_ncols=True)
    try:
        for step in bar:
            row = take_step(run, step)
            bar.set_postfix(loss=f"{row['loss']:.3f}")
            record_step(run, row, on_terminal)
            save_checkpoint_if_due(run, step)
        bar.close()
        save_final_checkpoint(run)
    except NonFiniteLoss:  # raised on every rank at the same step: a checkpoint still being written completes
        if run.writer is not None:
            run.writer.finish()
        raise
    if run.writer is not None:
        run.writer.finish()
    return finish_rank_run(run)


def start_rank_run(config: RunConfig, topology: Topology, run_dir: Path | None, resume_from: Path | None,
                   progress: Progress) -> RankRun:
    """Everything a rank's run needs before its first step: the data, the parallelized model (resumed
    from its checkpoint with --resume), rank 0's run files, the tracer and the schedule."""
    train_spec = config.train
    if train_spec.deterministic:
        torch.use_deterministic_algorithms(True)
    tokens = training_tokens(train_spec.data, config.model.vocab, config.model.seq_len)
    tokens, evaluator = split_for_evaluation(tokens, config)  # with --eval-every, training reads only the first part
    source = BatchSource(tokens, config.model.seq_len, train_spec.global_batch, train_spec.seed)
    parallel = parallelize_run(config, topology)
    model, optimizer = parallel.model, parallel.optimizer
    meter = ModelStateMeter(model, optimizer, lambda: gradients_of(optimizer), fp32_masters(optimizer),
                            parallel.unreduced_gradients)
    result = TrainResult(model=model, model_state_bytes=meter.held)
    if train_spec.resume and run_dir is not None and (checkpoint := resume_from or latest_checkpoint(run_dir)):
        result.first_step = load_checkpoint(checkpoint, model, optimizer)
    writes = run_dir is not None and topology.is_logging_rank
    log = MetricsLog(run_dir, result.first_step) if writes else None  # (makes the run directory)
    loggers = scalar_loggers(config, run_dir, result.first_step) if writes else []
    if writes:
        (run_dir / CONFIG_FILE).write_text(config_toml(config))
        if train_spec.tokenizer:  # kept so that plait sample decodes this run's tokens
            shutil.copyfile(train_spec.tokenizer, run_dir / TOKENIZER_FILE)
    writer = None if run_dir is None else CheckpointWriter(run_dir, run_identity(config), train_spec.keep_checkpoints,
                                                           train_spec.async_checkpoint)
    tracer = StepTracer(topology, train_spec.trace_every, result.first_step, train_spec.steps,
                        train_spec.profiled_steps, run_dir / PROFILE_DIR if run_dir is not None else None)
    return RankRun(config, topology, run_dir, parallel, source, evaluator, meter, result, log, loggers, writer, tracer,
                   lr_scheduler(optimizer, train_spec, result.first_step), progress,
                   resumed_spike_guard(train_spec.skip_spikes, log, result.first_step))


def resumed_spike_guard(factor: float, log: MetricsLog | None, first_step: int) -> SpikeGuard:
    """Collective on a resumed run: the gradient norms guard as the kept steps left it (rank 0 reads
    them from metrics.jsonl and hands them on)."""
    rows: list[list[dict] | None] = [log.kept_rows if log is not None else None]
    if first_step and dist.get_world_size() > 1:
        dist.broadcast_object_list(rows, src=0)
    return SpikeGuard.resumed(factor, rows[0] or [])


def scalar_loggers(config: RunConfig, run_dir: Path, first_step: int) -> list[TensorBoardLog | WandbLog]:
    """Rank 0's loggers of each step's scalars beside metrics.jsonl: TensorBoard's, W&B's, as the run asks."""
    train_spec, loggers = config.train, []
    if train_spec.tensorboard:
        loggers.append(TensorBoardLog(run_dir, first_step))
    if train_spec.wandb is not None:
        loggers.append(WandbLog(run_dir, train_spec.wandb, resolved_tables(config)))
    return loggers


def norm_policy(run: RankRun, step: int) -> NormPolicy:
    """Skip a spike (``--skip-spikes``); record each group's norm every --log-every steps, at the last,
    and at a skipped or notable step (``NOTABLE_FACTOR`` times the running median)."""
    train_spec, spikes = run.config.train, run.spikes
    logged = step % train_spec.log_every == 0 or step == train_spec.steps - 1
    return NormPolicy(spikes.is_spike,
                      lambda norm: logged or spikes.is_spike(norm) or spikes.exceeds(norm, NOTABLE_FACTOR))


def take_step(run: RankRun, step: int) -> dict:
    """One training step, traced when its turn comes: its row of metrics (the global loss, the
    learning rate, the gradient norm, time and throughput, the held-out loss when due)."""
    config, topology, progress = run.config, run.topology, run.progress
    train_spec, device = config.train, topology.device
    started = time.perf_counter()
    progress.step(step, "data")
    with run.tracer.step(step):
        lr = run.schedule.get_last_lr()[0]
        with run.tracer.span("data", part="data"):
            inputs, targets = run.source.local_batch(step, topology.coordinate("dp"), topology.size("dp"))
            inputs, targets, positions = context_shard(inputs, targets, topology)
        count = config.layout.microbatches
        micro = list(zip(inputs.chunk(count), targets.chunk(count)))
        try:
            watchers = StepWatchers(run.meter.before_reduction, progress.marking(run.tracer.span), progress)
            local_loss, norms = train_step(run.parallel, micro, train_spec.grad_clip, lambda: autocast(config, device),
                                           positions, watchers, norm_policy(run, step))
        except NonFiniteLoss as error:  # raised on every rank alike, so every rank sums the groups' norms
            norms = group_norms(error.local_squares, config.model.layers)
            if run.log is not None:
                write_non_finite(run.log.path.parent, step, lr, norms)
            raise NonFiniteLoss(f"step {step}: {error} ({non_finite_groups(norms)}), so the step "
                                "was not taken and nothing of it was logged or saved; resume from an earlier "
                                "checkpoint with a lower --lr, or check the data") from None
        grad_norm = norms.total.item()
        run.spikes.record(grad_norm, norms.skipped)
        run.schedule.step()
        if run.parallel.pipeline is not None:
            run.tracer.add_actions(run.parallel.pipeline.last_step_spans)
        progress.phase("loss all-reduce (dp)")
        dist.all_reduce(local_loss, op=dist.ReduceOp.AVG, group=topology.group("dp"))
        average_over_context(local_loss, topology)
        loss = local_loss.item()
        if not math.isfinite(loss):  # the same global loss on every rank, so every rank stops here
            raise NonFiniteLoss(f"step {step}: the loss is {loss}, so nothing of the step was logged or saved; "
                                "resume from an earlier checkpoint with a lower --lr, or check the data")
    elapsed = time.perf_counter() - started
    run.result.losses.append(loss)
    run.result.step_times.append(elapsed)
    run.result.observed.append(run.tracer.observes(step))
    evaluated = {}
    if run.evaluator is not None and ((step + 1) % train_spec.eval_every == 0 or step == train_spec.steps - 1):
        progress.phase("eval")
        evaluated["eval_loss"] = run.evaluator.evaluate(run.parallel, lambda: autocast(config, device))
    tokens_per_step = train_spec.global_batch * config.model.seq_len
    row = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
           "step_time_s": elapsed, "tokens_per_s": tokens_per_step / elapsed, **evaluated}
    if norms.skipped:
        row["skipped"] = True
        run.result.skipped_steps.append(step)
    if norms.local_squares is not None:  # outside the traced step: one all-reduce of a few floats, every rank alike
        row["grad_norm_by_group"] = norms.by_group(config.model.layers)
    return row


def record_step(run: RankRun, row: dict, on_terminal: bool) -> None:
    """A step's row into rank 0's metrics log and scalar loggers, and a plain line every --log-every steps
    when the output is not a terminal (which shows the bar)."""
    train_spec, step = run.config.train, row["step"]
    if run.log is not None:
        run.log.append(row)
    for logger in run.loggers:
        logger.add_step(row)
    last = step == train_spec.steps - 1
    if run.topology.is_logging_rank and not on_terminal and (step % train_spec.log_every == 0 or last):
        held_out = f", eval loss {row['eval_loss']:.4f}" if "eval_loss" in row else ""
        print(f"step {step}/{train_spec.steps}: loss {row['loss']:.4f}{held_out}, lr {row['lr']:.3g}, grad norm "
              f"{row['grad_norm']:.3g}, {row['tokens_per_s']:,.0f} tokens/s", flush=True)


def save_checkpoint_if_due(run: RankRun, step: int) -> None:
    """The checkpoint after ``step`` every --checkpoint-every steps, of finite weights only."""
    every = run.config.train.checkpoint_every
    if run.writer is None or not every or (step + 1) % every:
        return
    if not weights_are_finite(run.parallel.model):  # the last checkpoint kept stays one training can go on from
        raise NonFiniteLoss(f"step {step}: the weights are not finite after the step, so it was not saved; "
                            "resume from an earlier checkpoint with a lower --lr")
    run.progress.phase("checkpoint")
    run.writer.save(step + 1, run.parallel.model, run.parallel.optimizer)


def save_final_checkpoint(run: RankRun) -> None:
    """The checkpoint after the last step, where the run wants one (``wants_final_checkpoint``)."""
    train_spec = run.config.train
    run.progress.phase("final checkpoint")
    if run.writer is None or not wants_final_checkpoint(train_spec, run.result.first_step):
        return
    if not weights_are_finite(run.parallel.model):
        raise NonFiniteLoss(f"step {train_spec.steps - 1}: the weights are not finite after the step, so it "
                            "was not saved; resume from an earlier checkpoint with a lower --lr")
    run.writer.save(train_spec.steps, run.parallel.model, run.parallel.optimizer)


def finish_rank_run(run: RankRun) -> TrainResult:
    """After the last step: the pipeline's measured bubble, every rank's traces gathered, and rank 0's
    trace, summary, loss picture and scalar loggers closed."""
    result, run_dir, pipeline = run.result, run.run_dir, run.parallel.pipeline
    writes = run.log is not None
    run.progress.phase("gathering timelines and traces")
    if pipeline is not None and result.losses:
        result.pipeline = pipeline.measure().figures
    result.traces = run.tracer.gather()
    if writes and result.traces:
        write_run_trace(run_dir, result.traces, run.config.layout, result.pipeline.get("bubble_fraction"))
    run.progress.phase("summary")
    if run_dir is not None:
        result.summary = write_summary(run_dir, run.config, run.topology, result)
        if writes:
            draw_loss(run_dir)
    for logger in run.loggers:
        logger.close(result.summary, run.config.train.steps - 1)
    return result
