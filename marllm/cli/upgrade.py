"""``marllm upgrade CONFIG [--in-place]``: a config written in an earlier layout of marllm's, in today's
(:mod:`marllm.config.layouts`): every moved key at its place, each move said on stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from marllm.config import config_from_dict
from marllm.config.layouts import moves, todays_layout
from marllm.config.loading import read_yaml
from marllm.config.paths import absolute_config_paths


def add_upgrade(commands: Any) -> None:
    """The ``upgrade`` sub-command."""
    upgrade = commands.add_parser(
        "upgrade",
        help="write a config of an earlier layout (keys that have since moved into sections) in today's layout",
    )
    upgrade.add_argument("config", help="YAML config file")
    upgrade.add_argument(
        "--in-place",
        action="store_true",
        help="rewrite CONFIG (its comments are not kept) instead of printing today's layout to stdout",
    )
    upgrade.set_defaults(handler=upgrade_command)


def upgrade_command(args: argparse.Namespace) -> int:
    """Print (or write) ``args.config`` in today's layout, checked by loading it; say each move on stderr."""
    data = read_yaml(args.config)
    moved = moves(data)
    upgraded = yaml.safe_dump(todays_layout(data), sort_keys=False)
    for move in moved:
        print(f"marllm: moved {move}", file=sys.stderr)
    if not moved:
        print(f"marllm: {args.config} is in today's layout already", file=sys.stderr)
    if args.in_place and moved:
        folder = Path(args.config).resolve().parent
        config_from_dict(absolute_config_paths(yaml.safe_load(upgraded), folder, []))  # today's checks, before writing
        Path(args.config).write_text(upgraded, encoding="utf-8")
        print(f"marllm: {args.config} rewritten in today's layout", file=sys.stderr)
    elif not args.in_place:
        print(upgraded, end="")
    return 0
