"""``plait export`` (a run's weights in Hugging Face's layout), ``plait sample`` (text from a run) and
``plait prepare-data`` (text to a token file with a Hugging Face tokenizer).

Export and sample read the run's newest checkpoint into one full model in this process, whatever
layout wrote it; torch is imported only when a command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from plait.errors import ConfigError


def add_interop_commands(subparsers) -> None:
    """Register ``export``, ``sample`` and ``prepare-data`` on an argparse subparsers object."""
    formatter = argparse.ArgumentDefaultsHelpFormatter
    export = subparsers.add_parser(
        "export", help="write a run's weights as a Hugging Face model folder", formatter_class=formatter,
        description="Write the newest checkpoint of RUN (saved under any layout) as config.json and "
                    "model.safetensors of the Hugging Face GPT2LMHeadModel or LlamaForCausalLM of the same shape.")
    export.add_argument("run", metavar="RUN", help="the run directory of a `plait train` run with a checkpoint")
    export.add_argument("--to", required=True, metavar="DIR", default=argparse.SUPPRESS,
                        help="the folder to write (created; must not hold an export)")
    export.set_defaults(handler=run_export)

    sample = subparsers.add_parser(
        "sample", help="generate text from a run's newest checkpoint", formatter_class=formatter,
        description="Continue a prompt with the newest checkpoint of RUN, encoded and decoded with the run's "
                    "tokenizer.json if it kept one, else as UTF-8 bytes.")
    sample.add_argument("run", metavar="RUN", help="the run directory of a `plait train` run with a checkpoint")
    sample.add_argument("--prompt", required=True, default=argparse.SUPPRESS, help="the text to continue")
    sample.add_argument("--max-tokens", type=int, default=200, help="tokens to generate")
    sample.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy (argmax)")
    sample.add_argument("--top-k", type=int, default=0, help="sample among the K likeliest tokens only; 0: all")
    sample.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    sample.set_defaults(handler=run_sample)

    prepare = subparsers.add_parser(
        "prepare-data", help="tokenize text files into a token file for --data", formatter_class=formatter,
        description="Tokenize TEXT files, one after another, with a Hugging Face tokenizers file into a .u16 or "
                    ".u32 token file; train on it with --data OUT --tokenizer FILE --vocab N (N at least the "
                    "tokenizer's size) so the run keeps the tokenizer and plait sample decodes with it.")
    prepare.add_argument("texts", nargs="+", metavar="TEXT", help="UTF-8 text files")
    prepare.add_argument("--tokenizer", required=True, metavar="FILE", default=argparse.SUPPRESS,
                         help="a tokenizer.json saved by the tokenizers library")
    prepare.add_argument("--out", required=True, metavar="TOKENS", default=argparse.SUPPRESS,
                         help="the token file to write: .u16 (ids below 65,536) or .u32")
    prepare.set_defaults(handler=run_prepare_data)


def run_export(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.interop.hf import CONFIG_JSON, WEIGHTS_FILE, hf_config, write_hf
    from plait.train.full_model import checkpoint_spec, load_run_model, run_checkpoint

    target = Path(args.to)
    existing = next(path for path in (target, *target.parents) if path.exists())  # the folder or its nearest parent
    if not existing.is_dir():
        raise ConfigError(f"--to {target}: {existing} is a file; name a folder to write the export into")
    hf_config(checkpoint_spec(run_checkpoint(Path(args.run))))  # a model Hugging Face cannot hold is refused early
    held = [name for name in (CONFIG_JSON, WEIGHTS_FILE) if (target / name).exists()]
    if held:
        raise ConfigError(f"--to {target} already holds {' and '.join(held)}; choose another folder or remove them")
    model, checkpoint = load_run_model(Path(args.run))
    write_hf(model.spec, model.state_dict(), target)
    print(f"plait: exported {checkpoint} as {hf_config(model.spec)['architectures'][0]} to {target}/ "
          f"({CONFIG_JSON}, {WEIGHTS_FILE})")
    return 0


def run_sample(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.sample import Codec, check_sampling, generate

    check_sampling(args.max_tokens, args.temperature, args.top_k)
    from plait.train.full_model import checkpoint_spec, load_run_model, run_checkpoint

    codec = Codec(Path(args.run), checkpoint_spec(run_checkpoint(Path(args.run))).vocab)
    prompt = codec.encode(args.prompt)
    model, _ = load_run_model(Path(args.run))
    print(codec.decode(prompt + generate(model, prompt, args.max_tokens, args.temperature, args.top_k, args.seed)))
    return 0


def run_prepare_data(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.tokenizer import load_tokenizer, prepare_data

    count = prepare_data(args.texts, args.tokenizer, args.out)
    size = load_tokenizer(args.tokenizer).get_vocab_size()
    print(f"plait: wrote {count:,} tokens to {args.out} (vocabulary {size:,}); train on it with --data {args.out} "
          f"--tokenizer {args.tokenizer} --vocab {size}")
    return 0
