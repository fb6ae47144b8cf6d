"""``plait verify``: a layout against the single process, from one seed, on the same data.

Both runs go through ``plait train``'s own launcher (torchrun for the layout, this process for the
single rank), in fp32, each saving its final checkpoint; the losses come from their metrics and the
weights from their checkpoints, read back as full models. The tolerances are the test suite's
(torchtitan's loss-compare script is the model): every loss within 1e-5 of the single process's,
relative, and every weight within 1e-5 relative plus a floor near zero (see ``weight_floor``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from plait.config import RunConfig, config_toml, validate_run
from plait.errors import ConfigError
from plait.layout import Layout
from plait.observe.run_files import METRICS_FILE

RELATIVE_TOLERANCE = 1e-5
# Of one learning-rate step: Adam turns rounding noise in gradients near zero (the attention key
# bias, which softmax ignores) into updates no two summation orders share; an element that missed
# or repeated an update would be a whole step away, some hundred times this.
ADAM_STEP_FRACTION = 1e-2


@dataclass(frozen=True)
class Difference:
    """The largest difference found, where it was, and whether it is within tolerance."""

    value: float
    where: str
    passed: bool


def verification_configs(config: RunConfig) -> tuple[RunConfig, RunConfig]:
    """The layout's run and the single process's: fp32, a final checkpoint each, same model, seed and data."""
    train = replace(config.train, precision="fp32", final_checkpoint=True, checkpoint_every=0, resume=False,
                    eval_every=0, eval_data=None, tensorboard=False, wandb=None)
    laid_out = replace(config, train=train)
    single = replace(laid_out, layout=Layout())
    validate_run(single)
    return laid_out, single


def run_both(config: RunConfig, root: Path) -> tuple[Path, Path]:
    """Train the layout (through torchrun) and the single process (here) into ``root``/layout and /single."""
    from plait.train.launch import launch

    laid_out, single = verification_configs(config)
    root.mkdir(parents=True, exist_ok=True)
    layout_dir, single_dir = root / "layout", root / "single"
    config_file = root / "layout.toml"
    config_file.write_text(config_toml(laid_out))  # what plait train --config repeats exactly
    for run, directory, argv in ((laid_out, layout_dir, ["--config", str(config_file)]), (single, single_dir, [])):
        code = launch(replace(run, train=replace(run.train, run_dir=str(directory))), argv)
        if code != 0:
            raise ConfigError(f"the {'single-process' if run is single else 'layout'} run failed (exit {code}) with "
                              "the error above, so nothing was compared; fix it and verify again")
    return layout_dir, single_dir


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def loss_difference(expected: list[float], actual: list[float]) -> Difference:
    """The largest per-step loss difference, relative to the single process's loss."""
    gaps = [abs(a - b) / abs(a) for a, b in zip(expected, actual, strict=True)]
    step = max(range(len(gaps)), key=gaps.__getitem__)
    return Difference(gaps[step], f"step {step}", all(gap <= RELATIVE_TOLERANCE for gap in gaps))


def weight_floor(expected: dict[str, torch.Tensor], lr: float) -> float:
    """The absolute tolerance near zero: 1e-5 of the largest weight, or 1% of one learning-rate step."""
    scale = max(value.abs().max().item() for value in expected.values())
    return max(RELATIVE_TOLERANCE * scale, ADAM_STEP_FRACTION * lr)


def weight_difference(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], lr: float) -> Difference:
    """The largest final weight difference (absolute), and whether every element is within
    ``weight_floor`` + 1e-5 of its single-process value."""
    floor = weight_floor(expected, lr)
    largest, where, passed = 0.0, "", True
    for name, value in expected.items():
        gap = (actual[name] - value).abs()
        passed = passed and bool((gap <= floor + RELATIVE_TOLERANCE * value.abs()).all())
        if gap.max().item() >= largest:
            largest, where = gap.max().item(), name
    return Difference(largest, where, passed)


def compare_runs(layout_dir: Path, single_dir: Path, lr: float) -> tuple[Difference, Difference, float]:
    """The loss and weight differences of the two runs, and the weights' absolute floor."""
    from plait.train.full_model import load_run_model

    expected, actual = (load_run_model(directory)[0].state_dict() for directory in (single_dir, layout_dir))
    loss = loss_difference(losses(single_dir), losses(layout_dir))
    return loss, weight_difference(expected, actual, lr), weight_floor(expected, lr)


def report(config: RunConfig, loss: Difference, weights: Difference, floor: float) -> str:
    """What ``plait verify`` prints: each largest difference against its tolerance, and the verdict."""
    verdict = lambda difference: "ok" if difference.passed else "FAILED"  # noqa: E731
    return "\n".join([
        f"plait verify: {config.layout.describe()} against one process, {config.train.steps} steps of "
        f"{config.model_name or 'a custom model'} from seed {config.train.seed} in fp32",
        f"  loss     largest difference {loss.value:.2e} relative ({loss.where}), tolerance "
        f"{RELATIVE_TOLERANCE:.0e}: {verdict(loss)}",
        f"  weights  largest difference {weights.value:.2e} ({weights.where}), tolerance {RELATIVE_TOLERANCE:.0e} "
        f"relative + {floor:.1e}: {verdict(weights)}",
        f"plait verify: {'PASSED' if loss.passed and weights.passed else 'FAILED'}",
    ])
