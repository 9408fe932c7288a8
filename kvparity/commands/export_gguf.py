"""`kvparity export-gguf`: write the shipped HF checkpoints (or given checkpoint folders) as f32 GGUF, so
llama.cpp runs the very same weights.

By default it writes to $KVPARITY_GGUF_DIR, else ~/.cache/kvparity/gguf, a cache outside the source tree.
Bad arguments are one line on stderr and exit 3, found before anything is written. The writer itself
(tensor names, RoPE permutation, tokenizer, LoRA) is adapters/gguf_export.py, which the llama.cpp adapter
imports too.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Sequence

from adapters.gguf_export import CHECKPOINTS, SHIPPED, _resolve, default_out_dir, export_gguf
from conformance.exit_codes import ExitCode


def build_parser() -> argparse.ArgumentParser:
    """Every option has help text (argparse shows a default only beside help)."""
    from kvparity.parsing import UsageParser, summary

    parser = UsageParser(prog="kvparity export-gguf", description=summary(__doc__))
    parser.add_argument("checkpoints", nargs="*", default=None,
                        help=f"folders or shipped names (default: every shipped one present: {', '.join(SHIPPED)})")
    parser.add_argument("--out-dir", default=str(default_out_dir()),
                        help="output folder ($KVPARITY_GGUF_DIR, else ~/.cache/kvparity/gguf)")
    parser.add_argument("--force", action="store_true", help="rewrite even if an export of the same weights exists")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Arguments, the checkpoint folders and the output folder, all checked before the first export, so a
    bad name late in the list does not leave the earlier ones half done."""
    from kvparity.parsing import output_dir
    from conformance.contract import UsageError

    args = build_parser().parse_args(argv)
    names = args.checkpoints or [n for n in SHIPPED if (CHECKPOINTS / n).is_dir()]
    try:
        args.folders = {c: _resolve(c) for c in names}
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    args.out_dir = output_dir(args.out_dir)
    if importlib.util.find_spec("gguf") is None:
        raise UsageError("export-gguf needs the 'gguf' package: pip install 'kvparity[llamacpp]'")
    return args


def export(args: argparse.Namespace) -> int:
    """Write each GGUF and list name -> path; a checkpoint the writer cannot convert is one line, exit 3."""
    try:
        paths = {c: export_gguf(folder, args.out_dir, force=args.force) for c, folder in args.folders.items()}
    except (FileNotFoundError, ValueError) as exc:
        print(f"kvparity export-gguf: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return ExitCode.PASS


def main(argv: Sequence[str] | None = None) -> int:
    from kvparity.parsing import run_command

    return run_command("kvparity export-gguf", parse_args, export, argv)


if __name__ == "__main__":
    sys.exit(main())
