"""One truth: every layout plan ranks is one plait train accepts, and plan/simulate fail only in one line.

Random model shapes, GPU counts and batches are drawn from a fixed seed; the planner's top ten of
each must pass the one validation ``plait train`` runs (``config_from_args``, which ``--dry-run``
calls), and ``--dry-run`` itself accepts the top pick of a sample of them.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

import pytest

from plait.cli import build_parser, main
from plait.config import config_from_args
from plait.errors import ConfigError
from plait.facts.validity import run_problems
from plait.layout import Layout
from plait.models.spec import ModelSpec
from plait.hardware import CATALOG, hardware
from plait.plan.ranking import PLANNER_ERROR
from plait.plan.search import search
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from tests.schedule_cases import INTERLEAVING_SCHEDULES, ONE_CHUNK_SCHEDULES

CASES = 220
GPU_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 280, 512, 1024)


@dataclass(frozen=True)
class Case:
    spec: ModelSpec
    gpus: int
    global_batch: int
    gpu: str

    @property
    def precision(self) -> str:
        """What plait trains in on the case's GPU (fp32 on one without bf16)."""
        return "bf16" if hardware(self.gpu).has_bf16 else "fp32"

    def model_flags(self) -> list[str]:
        s = self.spec
        return ["--family", s.family, "--layers", str(s.layers), "--hidden", str(s.hidden), "--heads", str(s.heads),
                "--kv-heads", str(s.kv_heads), "--ffn-hidden", str(s.ffn_hidden), "--vocab", str(s.vocab),
                "--seq-len", str(s.seq_len)]


def random_case(rng: random.Random) -> Case:
    family = rng.choice(("gpt2", "llama"))
    heads = rng.choice((4, 8, 12, 16, 20, 32, 40, 64, 96, 128))
    hidden = heads * rng.choice((64, 80, 128))
    kv_heads = heads if family == "gpt2" else rng.choice([d for d in (1, 2, 4, 8, 16, heads) if heads % d == 0])
    ffn = 4 * hidden if family == "gpt2" else rng.choice((8 * hidden // 3 // 256 * 256 or 256, 3 * hidden, 3584))
    spec = ModelSpec(family, rng.randint(1, 126), hidden, heads, kv_heads, ffn,
                     rng.choice((256, 32000, 50257, 128256)), rng.choice((128, 512, 1024, 2048, 4096, 8192)),
                     tie_embeddings=family == "gpt2")
    gpus = rng.choice(GPU_COUNTS)
    global_batch = rng.choice((gpus, 2 * gpus, 3 * gpus, 64, 96, 512, 1536, rng.randint(1, 2048)))
    return Case(spec, gpus, global_batch, rng.choice(tuple(CATALOG)))


def _train_args(case: Case, flags: list[str], *extra: str):
    return build_parser().parse_args(["train", *case.model_flags(), "--global-batch", str(case.global_batch),
                                      "--precision", case.precision, *flags, *extra])


@pytest.fixture(scope="module")
def planned() -> list[tuple[Case, list]]:
    """Each random case with plan's top ten (empty when plan refuses it in a ConfigError)."""
    rng, out = random.Random(20261123), []
    for _ in range(CASES):
        case = random_case(rng)
        workload = Workload(case.spec, case.global_batch, case.precision)
        try:
            ranked = search(workload, hardware(case.gpu), case.gpus, top=10).ranked
        except ConfigError as error:
            assert "\n" not in str(error)
            ranked = []
        out.append((case, ranked))
    return out


def test_the_draw_plans_most_cases(planned):
    """The cases are not all refused: the check below sees hundreds of ranked layouts."""
    assert sum(len(ranked) for _, ranked in planned) >= 300
    assert sum(bool(ranked) for _, ranked in planned) >= 100


def test_every_ranked_layout_passes_train_validation(planned):
    for case, ranked in planned:
        for prediction in ranked:
            layout = prediction.layout
            assert run_problems(case.spec, layout, case.gpus, case.global_batch) == [], (case, layout)
            config = config_from_args(_train_args(case, layout.flags()))
            assert config.layout == layout


def test_the_ranked_layouts_fit_with_headroom(planned):
    for case, ranked in planned:
        hw = hardware(case.gpu)
        for prediction in ranked:
            assert prediction.fits and prediction.peak_memory_bytes <= hw.memory_bytes * (1 - hw.memory_headroom)


def test_dry_run_accepts_the_top_picks(planned, capsys):
    sample = [(case, ranked[0]) for case, ranked in planned if ranked][:12]
    for case, top in sample:
        argv = ["train", *case.model_flags(), "--global-batch", str(case.global_batch), "--precision", case.precision,
                *top.layout.flags(), "--gpu", case.gpu, "--dry-run"]
        assert main(argv) == 0, capsys.readouterr().err
        assert top.layout.describe() in capsys.readouterr().out


def test_simulate_of_random_pins_fails_only_in_one_line(capsys):
    """simulate with random, often impossible pins: a prediction (exit 0 or 1) or one ConfigError line."""
    rng = random.Random(7)
    outcomes = set()
    for _ in range(60):
        case = random_case(rng)
        pins = []
        for flag, choices in (("--tp", (1, 2, 3, 4, 8)), ("--pp", (1, 2, 4, 5)), ("--cp", (1, 2, 4)),
                              ("--zero", (0, 1, 2, 3)), ("--microbatches", (1, 2, 4, 8)),
                              ("--schedule", ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1"))):
            if rng.random() < 0.4:
                pins += [flag, str(rng.choice(choices))]
        if rng.random() < 0.3:
            pins.append(rng.choice(("--sp", "--no-sp")))
        code = main(["simulate", *case.model_flags(), "--gpus", str(case.gpus), "--gpu", case.gpu,
                     "--global-batch", str(case.global_batch), *pins, "--json"])
        captured = capsys.readouterr()
        assert code in (0, 1, 2)
        if code == 2:
            assert captured.err.strip().count("\n") == 0 and captured.err.startswith("plait: error:"), captured.err
        outcomes.add(code)
    assert outcomes >= {0, 2}


def test_no_sp_predicts_without_sequence_parallelism(capsys):
    common = ["simulate", "--model", "llama-8b", "--gpus", "8", "--tp", "8", "--dp", "1", "--cp", "1", "--pp", "1",
              "--microbatches", "8", "--recompute", "selective", "--gpu", "h100-sxm", "--global-batch", "8", "--json"]
    predictions = {}
    for flag in ("--sp", "--no-sp"):
        assert main([*common, flag]) == 0
        predictions[flag] = json.loads(capsys.readouterr().out)
    assert predictions["--sp"]["layout"]["sp"] is True and predictions["--no-sp"]["layout"]["sp"] is False
    # Without sp the norms and layer inputs are whole on every tp rank: more activation memory.
    sp, no_sp = (predictions[f]["memory_breakdown"]["activations"] for f in ("--sp", "--no-sp"))
    assert no_sp > sp


def test_a_pinned_layout_that_does_not_fit_exits_nonzero_with_its_memory(capsys):
    argv = ["simulate", "--model", "llama-70b", "--gpus", "8", "--gpu", "h100-sxm", "--global-batch", "8",
            "--dp", "8", "--tp", "1", "--cp", "1", "--pp", "1", "--zero", "0", "--microbatches", "1"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "peak memory per rank" in out and "params" in out
    assert main([*argv, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False


def test_plan_states_its_margin_and_whether_the_runner_up_is_within_its_error(capsys):
    assert main(["plan", "--model", "llama-70b", "--gpu", "h100-sxm", "--gpus", "64", "--gpus-per-node", "8",
                 "--global-batch", "512", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    top, reason = ranked[0], ranked[0]["reason"]
    capacity = hardware("h100-sxm").memory_bytes
    assert top["peak_memory_bytes"] <= 0.95 * capacity
    assert "free where the plan keeps at least 5%" in reason
    assert f"the planner's error of {PLANNER_ERROR:.1%}" in reason and "runner-up" in reason
    assert main(["plan", "--model", "llama-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512",
                 "--memory-headroom", "0.2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["peak_memory_bytes"] <= 0.8 * capacity


def test_a_layout_train_refuses_is_never_predicted():
    """PowerSGD under ZeRO-2 is refused by train, so simulate refuses it in the same words."""
    workload = Workload(ModelSpec("gpt2", 8, 256, 8, 8, 1024, 256, 128, tie_embeddings=True), 16, "bf16")
    layout = Layout(dp=2, pp=2, zero=2, grad_compression="powersgd")
    with pytest.raises(ConfigError) as refused:
        evaluate(workload, hardware("h100-sxm"), 4, layout)
    assert str(refused.value) == run_problems(workload.spec, layout, 4, 16)[0]
    assert "ZeRO stage 2's reduce-scatter" in str(refused.value)


def test_plan_refuses_nothing_train_accepts():
    """The converse: every layout of 8 ranks that train's validation accepts, pinned whole, is the
    one plan's search returns (a small model, so every one fits)."""
    spec = ModelSpec("llama", 6, 256, 8, 4, 512, 1000, 256, tie_embeddings=False)
    workload, hw = Workload(spec, 32, "bf16"), hardware("h100-sxm")
    checked = 0
    for dp, tp, cp, pp in itertools.product((1, 2, 4, 8), repeat=4):
        if dp * tp * cp * pp != 8:
            continue
        schedules = [(name, 1) for name in ONE_CHUNK_SCHEDULES] + [(name, v) for name in INTERLEAVING_SCHEDULES
                                                                   for v in (2, 3)]
        for zero, sp, m, (schedule, v) in itertools.product((0, 1, 2, 3), (False, True), (1, 2, 4), schedules):
            layout = Layout(dp=dp, tp=tp, cp=cp, pp=pp, sp=sp, zero=zero, schedule=schedule, virtual_stages=v,
                            microbatches=m)
            if pp == 1 and (schedule, v) != ("1f1b", 1) or run_problems(spec, layout, 8, 32):
                continue
            pinned = {k: v for k, v in layout.to_dict().items() if k != "stage_layers"}
            assert search(workload, hw, 8, pinned, top=1).ranked[0].layout == layout
            checked += 1
    assert checked > 150, checked


def test_a_split_given_at_one_stage_is_refused_before_any_worker_and_plan_ranks_the_stages_it_fits(capsys):
    """--stage-layers at --pp 1 (two chunk sizes, one stage) is refused by train's validation in one line,
    where the engine's stage split would otherwise raise in every worker; plan, free to choose pp, ranks
    only layouts whose stages take the split."""
    assert main(["train", "--model", "tiny", "--dp", "2", "--stage-layers", "3,1", "--dry-run"]) == 2
    assert "--pp 1 holds 1 chunk(s) (--virtual-stages); pass --pp 2" in capsys.readouterr().err
    assert main(["plan", "--model", "tiny", "--gpus", "4", "--stage-layers", "3,1", "--global-batch", "16",
                 "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert ranked and all(p["layout"]["pp"] == 2 and p["layout"]["stage_layers"] == [3, 1] for p in ranked)


def test_a_given_split_with_empty_end_chunks_plans_more_stages_than_layers(capsys):
    """Six stages of a four-block model, the embedding and the head alone at the ends: train accepts it,
    and so simulate predicts it, the same step as the dry run's."""
    pins = ["--model", "tiny", "--pp", "6", "--stage-layers", "0,1,1,1,1,0", "--microbatches", "6", "--schedule", "1f1b",
            "--global-batch", "12", "--gpu", "h100-sxm", "--precision", "bf16"]
    assert main(["train", *pins, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert main(["simulate", *pins, "--gpus", "6", "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert predicted["layout"]["stage_layers"] == [0, 1, 1, 1, 1, 0]
    assert f"{predicted['step_time_s']:.4g} s per step" in dry


def test_a_dry_run_for_a_named_gpu_takes_its_precision_as_plan_does(capsys):
    """On a host without CUDA, `train --dry-run --gpu h100-sxm` checks a command for an H100, which trains
    in bf16 there: plan's top pick, dry-run without --precision, predicts plan's step and memory."""
    common = ["--model", "llama-8b", "--global-batch", "64", "--gpu", "h100-sxm"]
    assert main(["plan", *common, "--gpus", "16", "--top", "1", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)[0]
    assert top["precision"] == "bf16"
    assert main(["train", *common, *Layout(**top["layout"] | {"stage_layers": None}).flags(), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ", bf16" in out and f"{top['step_time_s']:.4g} s per step" in out


def test_plan_prints_the_train_command_whose_dry_run_predicts_its_pick_on_the_cluster_it_was_given(capsys):
    """A cluster of four GPUs a node on a slow network, 94 GB parts: plan's top pick comes with the train
    command that runs it, and that command's --dry-run predicts the same step and memory."""
    argv = ["plan", "--model", "llama-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--top", "1",
            "--gpus-per-node", "4", "--inter-node-gbps", "12.5", "--memory-gb", "94"]
    assert main([*argv, "--json"]) == 0
    top = json.loads(capsys.readouterr().out)[0]
    command = top["train_command"]
    assert command[:2] == ["plait", "train"] and "--gpus-per-node" in command
    assert main([*command[1:], "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{top['step_time_s']:.4g} s per step" in out and f"{top['peak_memory_bytes'] / 2**20:,.1f} MiB" in out
    assert main(argv) == 0
    assert f"train it: {' '.join(command)}" in capsys.readouterr().out
    assert main(["plan", *argv[1:], "--stack", "megatron", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["train_command"] is None  # not a run plait trains


def test_a_device_figure_without_a_prediction_is_refused(capsys):
    assert main(["train", "--model", "tiny", "--memory-gb", "40"]) == 2
    assert "--memory-gb only changes the device a prediction is for; add --dry-run or --auto" in capsys.readouterr().err


def test_a_part_without_bf16_plans_plait_in_fp32_and_refuses_bf16(capsys):
    """A V100 computes in fp16, which plait does not train in: plan and a dry run for it take fp32, and
    bf16 is refused in one line; another stack's half precision is the V100's fp16."""
    common = ["--model", "gpt2", "--gpu", "v100"]
    assert main(["plan", *common, "--gpus", "8", "--top", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["precision"] == "fp32"
    assert main(["train", *common, "--dp", "8", "--global-batch", "64", "--dry-run"]) == 0
    assert ", fp32" in capsys.readouterr().out
    for command in (["plan", *common, "--gpus", "8"], ["train", *common, "--dp", "8", "--global-batch", "64", "--dry-run"]):
        assert main([*command, "--precision", "bf16"]) == 2
        assert "the v100 has no bf16" in capsys.readouterr().err
    assert main(["plan", *common, "--gpus", "8", "--top", "1", "--stack", "megatron", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["precision"] == "bf16"


def test_a_model_too_large_for_its_gpus_names_the_count_that_fits_and_plans_pick_there(capsys):
    assert main(["plan", "--model", "llama-8b", "--gpu", "h800", "--gpus", "1", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err
    assert "2 GPUs would fit it at the same global batch, plan's pick there " in err
    assert main(["plan", "--model", "llama-8b", "--gpu", "h800", "--gpus", "2", "--global-batch", "8", "--top", "1",
                 "--json"]) == 0
    top = json.loads(capsys.readouterr().out)[0]["layout"]
    assert err.strip().endswith(Layout(**top | {"stage_layers": None}).describe())


def test_a_dry_run_naming_no_device_accepts_plans_cluster_pick_on_a_small_machine(capsys):
    """plan's pick for llama-70b on 64 GPUs, dry-run here without --gpu: the run is checked, not this
    machine (whose RAM split 64 ways holds 0.4 GiB a rank); a rank no catalog GPU holds is still refused."""
    layout = ["--dp", "64", "--tp", "1", "--cp", "1", "--pp", "1", "--zero", "3", "--microbatches", "2",
              "--recompute", "full"]
    assert main(["train", "--model", "llama-70b", "--global-batch", "128", *layout, "--dry-run"]) == 0
    assert "the run is valid" in capsys.readouterr().out
    assert main(["train", "--model", "llama-70b", "--global-batch", "128", *layout[:-6], "--zero", "0",
                 "--microbatches", "2", "--recompute", "full", "--dry-run"]) == 2
    assert "the largest GPU of the catalog" in capsys.readouterr().err
