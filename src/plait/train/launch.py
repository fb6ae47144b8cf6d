"""Starting the ranks: a local torchrun when called from a shell, the worker when inside torchrun.

``plait train`` validates everything first, then either runs one rank in this process, starts
``torchrun --standalone`` with one process per rank, or (when torchrun started us, on one node or
many) runs as that rank's worker.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from plait.config import RunConfig
from plait.errors import ConfigError, RankZeroVerdict
from plait.interop.hf import check_init_from
from plait.layout import no_bf16
from plait.progress import Progress
from plait.observe.time_split import proportions
from plait.token_range import RANGE_ENV
from plait.topology import Topology, build_topology
from plait.train.checkpoint import CheckpointNotWritten
from plait.train.checkpoint_record import resumable_checkpoint
from plait.train.data import check_data, checked_tokens
from plait.train.host_memory import return_freed_tensors_to_the_os
from plait.train.loop import NonFiniteLoss, train
from plait.train.run_dir import RunDirLock, prepare_run_dir
from plait.train.start import inside_torchrun
from plait.train.torchrun_report import TORCHRUN_LOG, TorchrunReport
from plait.train.watchdog import stall_watchdog

# A collective that has not completed after this long raises on the rank that waits, naming it.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
# The checkpoint the local launcher checked for --resume, handed to its torchrun workers.
RESUME_ENV = "PLAIT_RESUME_FROM"
# Set by the local launcher for its torchrun workers: it checked the run directory and holds its lock.
CHECKED_ENV = "PLAIT_RUN_DIR_CHECKED"
# How often torchrun's elastic agent has restarted this group after losing a rank (0: the first start).
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
# CPU ranks a local launch may start per core: the default 8-rank layout runs on two cores.
CPU_RANKS_PER_CORE = 8
# NCCL's own watchdog keeps a flight record of each rank's last collectives and, when one times out,
# dumps it to RUN/nccl_trace_rank_<r> (read it with torch's `torchfrtrace`); a user's setting wins.
NCCL_FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def agreed_start(config: RunConfig, run_dir: Path) -> tuple[Path | None, RunDirLock | None]:
    """Collective: the checkpoint every rank resumes (None: step 0), and on rank 0 the run directory's
    lock where this rank holds it. The local launcher checked the run directory and --init-from and
    holds the lock (``CHECKED_ENV``); after an elastic restart rank 0 finds the newest complete
    checkpoint again. Under a torchrun plait did not start (Slurm's, a user's), rank 0 makes the local
    launcher's checks and takes its lock for the run's life: a used run directory without --resume, a
    link in it, a damaged checkpoint, a second job into a held directory or a bad --init-from is
    refused by every rank (rank 0 alone says so: ``run_worker``)."""
    checked = CHECKED_ENV in os.environ
    if checked and (not config.train.resume or RESUME_ENV in os.environ):
        return (Path(os.environ[RESUME_ENV]) if os.environ.get(RESUME_ENV) else None), None  # empty: step 0
    choice: list[str | None] = [None, None]  # the checkpoint (None: start from step 0), or why the run cannot start
    lock = None
    if dist.get_rank() == 0:
        try:
            if checked:
                checkpoint = resumable_checkpoint(run_dir, config)
            else:
                check_init_from(config)
                _, checkpoint, lock = prepare_run_dir(replace(config, train=replace(config.train, run_dir=str(run_dir))))
            choice[0] = None if checkpoint is None else str(checkpoint)
        except ConfigError as error:
            choice[1] = str(error)
    dist.broadcast_object_list(choice, src=0)
    if choice[1] is not None:
        raise RankZeroVerdict(choice[1])
    return (None if choice[0] is None else Path(choice[0])), lock


def agreed_data_range(config: RunConfig) -> None:
    """Collective: every rank holds a checked record of the data's id range (``RANGE_ENV``), so that none
    scans the file. The local launcher checked it already and handed its record on; under a torchrun plait
    did not start, rank 0 checks it here, once, and hands its record (or why the data is refused) to the
    others. (A rank whose file the record no longer describes scans it again.)"""
    if config.train.data is None or RANGE_ENV in os.environ:
        return
    outcome: list[str | None] = [None, None]  # the record, or why the data is refused
    if dist.get_rank() == 0:
        try:
            outcome[0] = checked_tokens(config.train.data, config.model.vocab, config.model.seq_len)[1].to_json()
        except ConfigError as error:
            outcome[1] = str(error)
    dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        raise RankZeroVerdict(outcome[1])
    os.environ[RANGE_ENV] = outcome[0]


def check_devices(config: RunConfig) -> None:
    """A local launch starts one process per rank: no more than this node can run."""
    world = config.layout.world_size
    if inside_torchrun():
        return
    if torch.cuda.is_available() and world > torch.cuda.device_count():
        raise ConfigError(
            f"the layout needs {world} GPUs but this node has {torch.cuda.device_count()}; "
            "use a smaller layout or launch on several nodes with torchrun"
        )
    cap = max(8, CPU_RANKS_PER_CORE * (os.cpu_count() or 1))
    if not torch.cuda.is_available() and world > cap:
        raise ConfigError(
            f"the layout needs {world} ranks, and a local launch on this {os.cpu_count()}-core machine starts at "
            f"most {cap} processes; use a smaller layout, or launch on several machines with torchrun"
        )


def check_precision(config: RunConfig) -> None:
    """bf16 only where the GPU computes in it: a V100 would emulate it, slowly (plan refuses it there
    in the same words, from the catalog)."""
    if (config.train.precision == "bf16" and torch.cuda.is_available()
            and not torch.cuda.is_bf16_supported(including_emulation=False)):
        raise ConfigError(no_bf16(torch.cuda.get_device_name()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def print_summary(summary: dict, run_dir: Path) -> None:
    pipelined = summary["layout"]["pp"] > 1
    bubble = (f"  bubble      {summary['bubble_fraction']:.1%} of the schedule's rank-time measured (median step), "
              f"{summary['bubble_fraction_theory']:.1%} in theory (equal costs)\n") if pipelined else ""
    split = summary.get("time_split")
    where = "" if split is None else (
        f"  time        compute : exposed communication : bubble = {proportions(split)} of the whole step "
        f"(median of {len(split['traced_steps'])} traced step(s))\n")
    traced = ", timeline.png, trace.json" if split is not None else ""
    print(
        f"plait: {summary['model']} under {summary['layout']['name']} on {summary['world_size']} rank(s), "
        f"steps {summary['first_step']}–{summary['steps'] - 1}\n"
        f"  loss        {summary['initial_loss']:.4f} → {summary['final_loss']:.4f}\n"
        f"  throughput  {summary['tokens_per_s']:,.0f} tokens/s, {summary['step_time_s'] * 1e3:.1f} ms/step (median)\n"
        f"  memory      {summary['peak_memory_bytes'] / 2**20:,.0f} MiB peak on the busiest rank\n"
        f"{bubble}{where}"
        f"  files       {run_dir}/ (metrics.jsonl, summary.json, loss.png{traced})"
    )


def join_process_group(backend: str) -> None:
    """Join the ranks' process group. After the elastic agent restarted the group, the agent's store
    still holds the lost attempt's keys (torchrun does not prefix them per attempt), and a rank that
    reads a dead peer's address there waits for it until the collective timeout; so a restarted
    group meets under keys of its own attempt."""
    restart = int(os.environ.get(RESTART_ENV, 0))
    if not restart or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # else rank 0 hosts a new store
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=COLLECTIVE_TIMEOUT)
    dist.init_process_group(backend, store=dist.PrefixStore(f"plait/attempt_{restart}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=COLLECTIVE_TIMEOUT)


@record  # an exception's traceback goes to torchrun's report, whose last line the launcher's failure line quotes
def run_worker(config: RunConfig, run_dir: Path, resume_from: Path | None = None) -> int:
    """This process is one rank: join the process group, train, report."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if config.train.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for determinism
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
        dump = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{run_dir}/nccl_trace_rank_"}
        for name, value in {**NCCL_FLIGHT_RECORDER, **dump}.items():
            os.environ.setdefault(name, value)
    else:
        device = torch.device("cpu")
        backend = "gloo"
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        return_freed_tensors_to_the_os()
    join_process_group(backend)
    try:
        summary = train_rank(config, device, run_dir, resume_from)
        if summary is not None:
            print_summary(summary, run_dir)
        dist.barrier()  # every rank past its last collective before any tears its groups down
    except RankZeroVerdict as error:
        # Rank 0 says it; the others wait until it has, since torchrun's agent stops the whole group at
        # the first rank that exits, rank 0 among them.
        if dist.get_rank() == 0:
            print(f"plait: error: {error}", file=sys.stderr, flush=True)
        dist.barrier()
        return 2
    except (NonFiniteLoss, CheckpointNotWritten) as error:
        if dist.get_rank() == 0:
            print(f"plait: error: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        # The model, its wrappers and the mesh hold the process groups; freed here, while the
        # interpreter is whole, destroy_process_group joins gloo's threads. Left to interpreter
        # exit, a group's threads can be destroyed unjoined and abort a run that finished
        # ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()
    return 0


def train_rank(config: RunConfig, device: torch.device, run_dir: Path, resume_from: Path | None) -> dict | None:
    """Train this rank; return rank 0's summary. What the run built dies with this frame."""
    topology = build_topology(config.layout, device)
    checkpoint, lock = (resume_from, None) if resume_from is not None else agreed_start(config, run_dir)
    try:
        return train_started_rank(config, topology, run_dir, checkpoint)
    finally:
        if lock is not None:
            lock.release()


def train_started_rank(config: RunConfig, topology: Topology, run_dir: Path, checkpoint: Path | None) -> dict | None:
    """Train this rank from ``checkpoint`` (None: step 0) once the start is agreed; rank 0's summary."""
    agreed_data_range(config)
    restart = int(os.environ.get(RESTART_ENV, 0))
    if restart and dist.get_rank() == 0:
        start = f"{checkpoint.name}" if checkpoint is not None else "step 0 (no complete checkpoint yet)"
        allowed = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?")  # torchrun's --max-restarts, however it started
        print(f"plait: restart {restart} of {allowed} after a lost rank: resuming from {start}", file=sys.stderr,
              flush=True)
    progress = Progress()
    with stall_watchdog(config.train.stall_timeout, progress, topology):
        return train(config, topology, run_dir, checkpoint, progress).summary


def after_restart(config: RunConfig) -> RunConfig:
    """The config a worker runs: after the elastic agent restarted the group (a rank was lost), every
    rank goes on from the run dir's newest complete checkpoint by itself, as ``--resume`` does."""
    if not int(os.environ.get(RESTART_ENV, 0)):
        return config
    os.environ.pop(RESUME_ENV, None)  # the launcher's choice predates the checkpoints written since
    return replace(config, train=replace(config.train, resume=True))


def launch(config: RunConfig, argv: list[str]) -> int:
    """Run ``plait train`` with ``argv`` (already validated into ``config``) on every rank."""
    if inside_torchrun():
        return run_worker(after_restart(config), Path(config.train.run_dir or "runs/torchrun"))
    check_devices(config)
    check_precision(config)
    data_range = check_data(config)
    check_init_from(config)
    run_dir, checkpoint, lock = prepare_run_dir(config)
    try:
        world = config.layout.world_size
        checked = {CHECKED_ENV: "1", **({RESUME_ENV: "" if checkpoint is None else str(checkpoint)}
                                        if config.train.resume else {})}
        if data_range is not None:
            checked[RANGE_ENV] = data_range.to_json()
        if world == 1 and not config.train.max_restarts:  # one rank with no restarts runs in this process
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                              **checked)
            return run_worker(config, run_dir, checkpoint)
        threads = max(1, (os.cpu_count() or 1) // world)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            f"--max-restarts={config.train.max_restarts}",
            "-m", "plait", "train", *argv, "--run-dir", str(run_dir),
        ]
        report = TorchrunReport(run_dir / TORCHRUN_LOG, sys.stderr, config.layout, config.train.max_restarts)
        return run_torchrun(command, {**os.environ, "OMP_NUM_THREADS": str(threads), **checked},
                            None if lock is None else lock.fd, report)
    finally:
        if lock is not None:
            lock.release()


# Signals that stop a local run: the first is handed to torchrun as SIGTERM, on which its agent stops
# every worker (SIGTERM, then SIGKILL after its grace period) before it exits.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1


def _dies_with_its_parent() -> Callable[[], None]:
    """What the torchrun child runs before it starts: SIGTERM when the launcher dies, even by SIGKILL
    (Linux's parent-death signal), so its workers, each in a session of its own, are never left
    running without it; a launcher already gone by then ends it at once. (libc is looked up here, in
    the parent.)"""
    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the handlers below still forward every catchable signal
        return lambda: None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)

    return arm


def run_torchrun(command: list[str], env: dict[str, str], lock_fd: int | None, report: TorchrunReport) -> int:
    """Run ``command`` (torchrun) in a session of its own and wait for it, handing it the first stopping
    signal this launcher gets (a terminal's Ctrl-C, `kill`, `timeout`; its agent then stops every
    worker, escalating on its own) rather than dying without it: Python's subprocess.run would SIGKILL
    torchrun on Ctrl-C, whose workers then live on. A signal ignored here (under nohup) stays ignored.
    torchrun inherits the run directory's lock (``lock_fd``), which so lasts until it has stopped every
    rank. Its stderr goes through ``report`` (plait.train.torchrun_report). Returns its status, or 128 +
    the signal that stopped the run, after saying so in one line; a failure ends in ``report``'s line."""
    process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_dies_with_its_parent(),
                               pass_fds=() if lock_fd is None else (lock_fd,), stderr=subprocess.PIPE, text=True,
                               errors="replace")
    reader = report.follow(process.stderr)
    received: list[int] = []

    def hand_on(signum, frame) -> None:
        if not received and process.poll() is None:
            print(f"plait: {signal.Signals(signum).name} received; stopping every rank", file=sys.stderr, flush=True)
            process.send_signal(signal.SIGTERM)
        received.append(signum)

    caught = [signum for signum in STOPPING_SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN]
    previous = {signum: signal.signal(signum, hand_on) for signum in caught}
    try:
        status = process.wait()
        reader.join(timeout=10)  # EOF once every worker is gone; one left running must not hang the launcher
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        print(f"plait: stopped by {signal.Signals(received[0]).name}; resume with --resume from the newest complete "
              "checkpoint", file=sys.stderr, flush=True)
        return 128 + received[0]
    if status != 0:
        print(report.failure_line(status), file=sys.stderr, flush=True)
    return status
