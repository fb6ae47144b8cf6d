"""The one topology object: how a model is spread over ranks.

Pure Python, shared by training (which builds a DeviceMesh from it in ``plait.topology``) and the
planner (which searches over it). It is passed explicitly; nothing reads it from a global.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from plait.errors import ConfigError
from plait.schedules.registry import SCHEDULES, check_virtual_stages, schedule_spec  # noqa: F401 (a choice list)

# Each field's choices: the schedule's every registered schedule's name (SCHEDULES, imported above),
# the others these.
RECOMPUTE = ("none", "selective", "op", "full")
ZERO_STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16")
# How the data-parallel gradient reduction travels (plait.parallel.data_parallel.compression): as computed, cast
# to bf16 for the wire, or PowerSGD's low-rank factors with error feedback (lossy).
GRAD_COMPRESSIONS = ("none", "bf16", "powersgd")
# How context-parallel attention sees the whole sequence: heads exchanged all-to-all (Ulysses), K/V
# blocks passed round a ring, or all K/V gathered at once (Llama 3); plait.parallel.context says
# when each wins.
CP_ALGORITHMS = ("all-to-all", "ring", "all-gather")
# The algorithms that cut the sequence into 2·cp chunks, rank r holding chunks r and 2cp-1-r.
ZIGZAG_ALGORITHMS = ("ring", "all-gather")
# Mesh dimension order, outermost first: tensor parallel is innermost so its heavy traffic stays
# on the fastest links (inside a node), pipeline outermost as it moves the least.
MESH_DIMS = ("pp", "dp", "cp", "tp")
# The groups data parallelism communicates on: the gradients' reduction and ZeRO's
# (``Layout.replica_dim``, ``Layout.zero_dim``), the replicas of hybrid sharding, the loss's average.
DATA_GROUPS = ("dp", "dp_shard", "dp_replicate", "dp_cp", "dp_shard_cp")


def default_precision(on_gpu: bool) -> str:
    """What plait train runs when --precision is not given, and so what plan predicts by default:
    bf16 autocast on GPUs that compute in it (their tensor cores' format), fp32 on CPUs (which have no
    fast bf16 path) and on GPUs without bf16 (a V100's half precision is fp16)."""
    return "bf16" if on_gpu else "fp32"


def no_bf16(device: str) -> str:
    """Why plait refuses bf16 on ``device``, a GPU that does not compute in it (the catalog's
    ``has_bf16`` in the planner, or the driver's answer at launch)."""
    return (f"the {device} has no bf16 (its mixed precision is fp16, which plait does not train in); "
            "pass --precision fp32")


def _joined_with_cp(dim: str, cp: int) -> str:
    """The name of the group of ``dim``'s ranks with the cp ranks beside them."""
    return dim if cp == 1 else f"{dim}_cp"


@dataclass(frozen=True)
class Layout:
    """Sizes of each parallel dimension plus the choices that go with them."""

    dp: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1
    sp: bool = False
    zero: int = 0
    schedule: str = "1f1b"
    virtual_stages: int = 1
    microbatches: int = 1
    stage_layers: tuple[int, ...] | None = None  # blocks per pipeline chunk; None: balanced by FLOPs
    recompute: str = "none"
    # With recompute "full": only the first N blocks of each pipeline chunk rerun their forward in
    # backward and the others keep everything (Megatron-LM's block method); None: every block.
    recompute_layers: int | None = None
    # What each block saves for backward waits in host memory between its forward and its backward
    # (plait.parallel.offload); the blocks then recompute nothing.
    offload_activations: bool = False
    grad_compression: str = "none"
    cp_algorithm: str = "all-to-all"
    # Hybrid sharding (HSDP): the dp ranks as dp_replicate groups of dp/dp_replicate neighbours;
    # ZeRO shards inside a group and the groups hold replicas (1: ZeRO shards over all dp ranks).
    dp_replicate: int = 1

    @property
    def dp_shard(self) -> int:
        """The dp ranks of one replica group (all of them without hybrid sharding)."""
        return self.dp // self.dp_replicate

    @property
    def replica_dim(self) -> str:
        """The group of every rank holding the same weights, which averages their gradients: the dp
        ranks with the cp ranks beside them (each saw its own slice of the same sequences), ``dp_cp``,
        or ``dp`` without cp. Groups are named by their role, each its own process group
        (plait.topology), so that at dp 1 a trace tells the gradients' reduction from cp's attention
        traffic on the same ranks."""
        return _joined_with_cp("dp", self.cp)

    @property
    def zero_dim(self) -> str:
        """The group ZeRO shards over and reduce-scatters in: the replica group, or under hybrid
        sharding one replica group's dp ranks with the cp ranks beside them (``dp_shard_cp``), as
        Megatron-LM's distributed optimizer and torchtitan's FSDP2 shard. Under hybrid sharding the
        replica groups average across each other on ``dp_replicate``."""
        return _joined_with_cp("dp_shard", self.cp) if self.dp_replicate > 1 else self.replica_dim

    def group_size(self, dim: str) -> int:
        """Ranks in the group ``dim``: a mesh dimension, or one of the groups joining several
        (``dp_replicate``, ``dp_shard``, ``dp_cp``, ``dp_shard_cp``)."""
        if dim in MESH_DIMS:
            return getattr(self, dim)
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "dp_cp": self.dp * self.cp,
                "dp_shard_cp": self.dp_shard * self.cp}[dim]

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def rank_name(self, rank: int) -> str:
        """A global rank's coordinates on the dimensions that are split, e.g. ``dp1·tp0·pp1``: the
        device mesh lays the ranks out over ``MESH_DIMS`` in order, the last varying fastest."""
        coordinates, rest = {}, rank
        for dim in reversed(MESH_DIMS):
            coordinates[dim], rest = rest % self.group_size(dim), rest // self.group_size(dim)
        split = [f"{dim}{coordinates[dim]}" for dim in ("dp", "cp", "tp", "pp") if self.group_size(dim) > 1]
        return "·".join(split) or "rank 0"

    def describe(self) -> str:
        """A short human name such as ``dp2·tp2·pp2 (1f1b, m=4)``."""
        parts = [f"{name}{getattr(self, name)}" for name in ("dp", "tp", "cp", "pp") if getattr(self, name) > 1]
        if self.dp_replicate > 1:
            parts[0] = f"dp{self.dp_replicate}×{self.dp_shard}"
        text = "·".join(parts) or "single"
        extras = []
        if self.zero:
            extras.append(f"zero{self.zero}")
        if self.sp:
            extras.append("sp")
        if self.pp > 1:
            v = f", v={self.virtual_stages}" if self.virtual_stages > 1 else ""
            extras.append(f"{self.schedule}{v}")
        if self.microbatches > 1:
            extras.append(f"m={self.microbatches}")
        if self.recompute != "none":
            partial = f":{self.recompute_layers}" if self.recompute_layers is not None else ""
            extras.append(f"recompute={self.recompute}{partial}")
        if self.offload_activations:
            extras.append("offload")
        if self.grad_compression != "none":
            extras.append(f"grads {self.grad_compression}")
        if self.cp > 1 and self.cp_algorithm != Layout.cp_algorithm:
            extras.append(self.cp_algorithm)
        return f"{text} ({', '.join(extras)})" if extras else text

    def to_dict(self) -> dict:
        return asdict(self)

    def flags(self) -> list[str]:
        """``plait train`` flags that pin every field of the layout."""
        flags = []
        for name, value in self.to_dict().items():
            flag = "--" + name.replace("_", "-")
            if name in ("sp", "offload_activations"):  # the booleans
                flags.append(flag if value else "--no-" + flag[2:])
            elif name == "stage_layers":
                if value is not None:
                    flags += [flag, ",".join(map(str, value))]
            elif value is None:  # a default that only a value can name (recompute_layers: every block)
                continue
            else:
                flags += [flag, str(value)]
        return flags

    def with_recompute(self, mode: str) -> Layout:
        """This layout with ``mode`` as its blocks' recomputation: how the facts and the planner cost a
        block whose own recomputation is not the layout's (plait.facts.recompute). It copies the fields
        as they are, without dataclasses.replace, which runs __init__ over every field read by name:
        seven times slower, and the planner's search asks tens of thousands of times."""
        if mode == self.recompute:
            return self
        other = object.__new__(Layout)
        other.__dict__.update(self.__dict__, recompute=mode)
        return other

    def validate(self) -> None:
        """Raise ConfigError with one actionable sentence if the layout is inconsistent in itself."""
        for name in ("dp", "tp", "cp", "pp", "virtual_stages", "microbatches", "dp_replicate"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.stage_layers is not None and not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in self.stage_layers):
            raise ConfigError(f"stage-layers must be whole numbers of blocks, 0 or more each, got {self.stage_layers!r}")
        if self.zero not in ZERO_STAGES:
            raise ConfigError(f"ZeRO stage {self.zero!r} does not exist; use 0, 1, 2 or 3")
        schedule = schedule_spec(self.schedule)  # (refuses a name no schedule is registered under)
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"unknown recompute mode {self.recompute!r}; use one of {', '.join(RECOMPUTE)}")
        if self.recompute_layers is not None:
            if not isinstance(self.recompute_layers, int) or isinstance(self.recompute_layers, bool) or self.recompute_layers < 1:
                raise ConfigError(f"recompute-layers must be a positive integer, got {self.recompute_layers!r}")
            if self.recompute != "full":
                raise ConfigError(f"--recompute-layers {self.recompute_layers} picks the blocks that recompute fully; "
                                  "pass --recompute full with it, or drop --recompute-layers")
        if self.offload_activations and self.recompute != "none":
            raise ConfigError(f"--offload-activations moves what each block saves to host memory, and --recompute "
                              f"{self.recompute} keeps a block's inputs on the device for its replay (Megatron-Core "
                              "refuses the pair too); drop one of them")
        if self.grad_compression not in GRAD_COMPRESSIONS:
            raise ConfigError(f"unknown gradient compression {self.grad_compression!r}; "
                              f"use one of {', '.join(GRAD_COMPRESSIONS)}")
        if self.cp_algorithm not in CP_ALGORITHMS:
            raise ConfigError(f"unknown context-parallel algorithm {self.cp_algorithm!r}; "
                              f"use one of {', '.join(CP_ALGORITHMS)}")
        if self.zero and self.dp * self.cp == 1:
            raise ConfigError(
                f"ZeRO stage {self.zero} shards over the data- and context-parallel ranks and has no effect with "
                "--dp 1 and --cp 1; pass --dp 2 or more (or --cp 2 or more), or drop --zero"
            )
        if self.dp % self.dp_replicate:
            raise ConfigError(f"--dp-replicate {self.dp_replicate} must divide --dp {self.dp}: the dp ranks form "
                              "dp-replicate groups of equal size; pass --dp-replicate R --dp-shard S instead of --dp")
        if self.dp_replicate > 1 and self.zero == 0:
            raise ConfigError("hybrid sharding (--dp-replicate) shards inside each replica group, and ZeRO stage 0 "
                              "shards nothing; pass --zero 1, 2 or 3, or drop --dp-replicate")
        if self.sp and self.tp == 1:
            raise ConfigError("sequence parallel (--sp) shards the tensor-parallel group, so it needs --tp 2 or more")
        check_virtual_stages(schedule, self.virtual_stages)
