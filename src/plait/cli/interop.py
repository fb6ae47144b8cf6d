"""``plait export`` (a run's weights in Hugging Face's layout), ``plait sample`` (text from a run) and
``plait prepare-data`` (text to a token file with a Hugging Face tokenizer).

Both read the run's newest checkpoint, whatever layout wrote it: sample into one full model in this
process, export one tensor at a time (so it needs memory for the largest tensor, not the model);
torch is imported only when a command runs.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from plait.errors import ConfigError

# plait sample's most new tokens: each is a forward of the whole model on one process, and a bound
# keeps a mistyped count from running for days
MAX_SAMPLED_TOKENS = 100_000


def add_interop_commands(subparsers) -> None:
    """Register ``export``, ``sample`` and ``prepare-data`` on an argparse subparsers object."""
    from plait.tokenizer import EOS_TOKENS

    formatter = argparse.ArgumentDefaultsHelpFormatter
    export = subparsers.add_parser(
        "export", help="write a run's weights as a Hugging Face model folder", formatter_class=formatter,
        description="Write the newest checkpoint of RUN (saved under any layout) as the Hugging Face GPT2LMHeadModel "
                    "or LlamaForCausalLM of the same shape: config.json, the weights in safetensors shards (with "
                    "model.safetensors.index.json when more than one), streamed a tensor at a time, and the run's "
                    "tokenizer.json with a tokenizer_config.json when it trained with one.")
    export.add_argument("run", metavar="RUN", help="the run directory of a `plait train` run with a checkpoint")
    export.add_argument("--to", required=True, metavar="DIR", default=argparse.SUPPRESS,
                        help="the folder to write (created; must not hold an export)")
    export.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                        help="the largest weight file, as save_pretrained takes it: bytes, or with a unit (500MB, 5GB "
                             "= 5·10⁹ bytes, 2GiB); a tensor larger than it gets a file of its own")
    export.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the weights' type in the files: fp32, the run's master weights as they are, or bf16, "
                             "half the bytes (rounded to nearest even)")
    export.set_defaults(handler=run_export)

    sample = subparsers.add_parser(
        "sample", help="generate text from a run's newest checkpoint", formatter_class=formatter,
        description="Continue a prompt with the newest checkpoint of RUN, encoded and decoded with the run's "
                    "tokenizer.json if it kept one, else as UTF-8 bytes.")
    sample.add_argument("run", metavar="RUN", help="the run directory of a `plait train` run with a checkpoint")
    sample.add_argument("--prompt", required=True, default=argparse.SUPPRESS, help="the text to continue")
    sample.add_argument("--max-tokens", type=int, default=200,
                        help=f"tokens to generate, at most {MAX_SAMPLED_TOKENS:,}")
    sample.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy (argmax)")
    sample.add_argument("--top-k", type=int, default=0, help="sample among the K likeliest tokens only; 0: all")
    sample.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    sample.set_defaults(handler=run_sample)

    prepare = subparsers.add_parser(
        "prepare-data", help="tokenize text files into a token file for --data", formatter_class=formatter,
        description="Tokenize TEXT files, one after another, with a Hugging Face tokenizers file into a .u16 or "
                    ".u32 token file, on every core, each file a document followed by the tokenizer's end-of-document "
                    "token; train on it with --data OUT --tokenizer FILE --vocab N (N at least the tokenizer's size) "
                    "so the run keeps the tokenizer and plait sample decodes with it.")
    prepare.add_argument("texts", nargs="+", metavar="TEXT", help="UTF-8 text files")
    prepare.add_argument("--tokenizer", required=True, metavar="FILE", default=argparse.SUPPRESS,
                         help="a tokenizer.json saved by the tokenizers library")
    prepare.add_argument("--out", required=True, metavar="TOKENS", default=argparse.SUPPRESS,
                         help="the token file to write: .u16 (ids below 65,536) or .u32")
    prepare.add_argument("--eos-token", metavar="TOKEN", default=argparse.SUPPRESS,  # shown below, not as None
                         help="the token put after each document (default: the first the tokenizer has of "
                              f"{', '.join(EOS_TOKENS)})")
    prepare.set_defaults(handler=run_prepare_data)


def run_export(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.interop.hf_config import CONFIG_JSON, WEIGHTS_FILE, WEIGHTS_INDEX, hf_config
    from plait.interop.hf_export import TOKENIZER_CONFIG, parse_size, write_hf, write_tokenizer
    from plait.tokenizer import TOKENIZER_FILE
    from plait.train.full_model import checkpoint_parameters, checkpoint_spec, run_checkpoint

    max_shard_bytes = parse_size(args.max_shard_size)
    target = Path(args.to)
    existing = next(path for path in (target, *target.parents) if path.exists())  # the folder or its nearest parent
    if not existing.is_dir():
        raise ConfigError(f"--to {target}: {existing} is a file; name a folder to write the export into")
    checkpoint = run_checkpoint(Path(args.run))
    spec = checkpoint_spec(checkpoint)
    architecture = hf_config(spec)["architectures"][0]  # a model Hugging Face cannot hold is refused here
    held = [name for name in (CONFIG_JSON, WEIGHTS_FILE, WEIGHTS_INDEX) if (target / name).exists()]
    if held:
        raise ConfigError(f"--to {target} already holds {' and '.join(held)}; choose another folder or remove them")
    files = write_hf(spec, checkpoint_parameters(checkpoint), target, max_shard_bytes, args.dtype)
    weights = files[0] if len(files) == 1 else f"{len(files) - 1} shards with {files[-1]}"
    print(f"plait: exported {checkpoint} as {architecture} to {target}/ ({CONFIG_JSON}, {weights}, {args.dtype})")
    if write_tokenizer(Path(args.run), target, spec):
        print(f"plait: with the run's tokenizer ({TOKENIZER_FILE}, {TOKENIZER_CONFIG}) for AutoTokenizer")
    else:
        print(f"plait: the run read raw bytes (no {TOKENIZER_FILE}), so the export holds no tokenizer: token ids are "
              "the text's UTF-8 bytes")
    return 0


def check_sampling(max_tokens: int, temperature: float, top_k: int) -> None:
    """Refuse sampling flags before torch is imported."""
    if not 1 <= max_tokens <= MAX_SAMPLED_TOKENS:
        raise ConfigError(f"--max-tokens must be a positive integer of at most {MAX_SAMPLED_TOKENS:,}, got {max_tokens}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ConfigError(f"--temperature must be 0 (greedy) or a positive finite number, got {temperature}")
    if top_k < 0:
        raise ConfigError(f"--top-k must be 0 (no cut) or positive, got {top_k}")


def run_sample(args: argparse.Namespace, argv: list[str]) -> int:
    check_sampling(args.max_tokens, args.temperature, args.top_k)
    from plait.sample import Codec, generate

    from plait.train.full_model import checkpoint_spec, load_run_model, run_checkpoint

    codec = Codec(Path(args.run), checkpoint_spec(run_checkpoint(Path(args.run))).vocab)
    prompt = codec.encode(args.prompt)
    model, _ = load_run_model(Path(args.run))
    print(codec.decode(prompt + generate(model, prompt, args.max_tokens, args.temperature, args.top_k, args.seed)))
    return 0


def run_prepare_data(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.tokenizer import end_of_document, load_tokenizer, prepare_data

    eos_token = vars(args).get("eos_token")
    count = prepare_data(args.texts, args.tokenizer, args.out, eos_token)
    tokenizer = load_tokenizer(args.tokenizer)
    size, (eos, eos_id) = tokenizer.get_vocab_size(), end_of_document(tokenizer, args.tokenizer, eos_token)
    print(f"plait: wrote {count:,} tokens to {args.out} (vocabulary {size:,}, each document ended by {eos}, id "
          f"{eos_id}); train on it with --data {args.out} --tokenizer {args.tokenizer} --vocab {size}")
    return 0
