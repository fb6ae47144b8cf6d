"""``plait export`` (a run's weights in Hugging Face's layout) and ``plait sample`` (text from a run).

Both read the run's newest checkpoint into one full model in this process, whatever layout wrote
it; torch is imported only when a command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from plait.errors import ConfigError


def add_interop_commands(subparsers) -> None:
    """Register ``export`` and ``sample`` on an argparse subparsers object."""
    formatter = argparse.ArgumentDefaultsHelpFormatter
    export = subparsers.add_parser(
        "export", help="write a run's weights as a Hugging Face model folder", formatter_class=formatter,
        description="Write the newest checkpoint of RUN (saved under any layout) as config.json and "
                    "model.safetensors of the Hugging Face GPT2LMHeadModel or LlamaForCausalLM of the same shape.")
    export.add_argument("run", metavar="RUN", help="the run directory of a `plait train` run with a checkpoint")
    export.add_argument("--to", required=True, metavar="DIR", default=argparse.SUPPRESS, help="the folder to write (created; must not hold an export)")
    export.set_defaults(handler=run_export)

    sample = subparsers.add_parser(
        "sample", help="generate text from a run's newest checkpoint", formatter_class=formatter,
        description="Continue a prompt with the newest checkpoint of RUN (a byte-level run: the prompt is read as "
                    "UTF-8 bytes and the output decoded from bytes).")
    sample.add_argument("run", metavar="RUN", help="the run directory of a `plait train` run with a checkpoint")
    sample.add_argument("--prompt", required=True, default=argparse.SUPPRESS, help="the text to continue")
    sample.add_argument("--max-tokens", type=int, default=200, help="tokens to generate")
    sample.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy (argmax)")
    sample.add_argument("--top-k", type=int, default=0, help="sample among the K likeliest tokens only; 0: all")
    sample.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    sample.set_defaults(handler=run_sample)


def run_export(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.interop.hf import CONFIG_JSON, WEIGHTS_FILE, hf_config, write_hf
    from plait.train.full_model import checkpoint_spec, load_run_model, run_checkpoint

    hf_config(checkpoint_spec(run_checkpoint(Path(args.run))))  # a model Hugging Face cannot hold is refused first
    target = Path(args.to)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--to {target} is a file; name a folder to write the export into")
    held = [name for name in (CONFIG_JSON, WEIGHTS_FILE) if (target / name).exists()]
    if held:
        raise ConfigError(f"--to {target} already holds {' and '.join(held)}; choose another folder or remove them")
    model, checkpoint = load_run_model(Path(args.run))
    write_hf(model.spec, model.state_dict(), target)
    print(f"plait: exported {checkpoint} as {hf_config(model.spec)['architectures'][0]} to {target}/ "
          f"({CONFIG_JSON}, {WEIGHTS_FILE})")
    return 0


def run_sample(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.sample import check_sampling, decode_bytes, encode_bytes, generate

    check_sampling(args.max_tokens, args.temperature, args.top_k)
    from plait.train.full_model import checkpoint_spec, load_run_model, run_checkpoint

    prompt = encode_bytes(args.prompt, checkpoint_spec(run_checkpoint(Path(args.run))).vocab)
    model, _ = load_run_model(Path(args.run))
    tokens = generate(model, prompt, args.max_tokens, args.temperature, args.top_k, args.seed)
    print(args.prompt + decode_bytes(tokens))
    return 0
