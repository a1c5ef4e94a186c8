"""Argument parsing shared by the entry points: known flags plus `--concern.field value` plan overrides.

MLflow appends parameters an entry point does not declare as `--name value`, so any
plan field can be overridden with `-P concern.field=value`.
"""
from __future__ import annotations

import argparse


def parse(parser: argparse.ArgumentParser, argv=None) -> tuple[argparse.Namespace, dict[str, str]]:
    args, rest = parser.parse_known_args(argv)
    overrides: dict[str, str] = {}
    i = 0
    while i < len(rest):
        key = rest[i]
        if not key.startswith("--") or "." not in key:
            parser.error(f"unexpected argument {key!r}: plan overrides look like --concern.field VALUE")
        if "=" in key:
            k, v = key[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(rest):
                parser.error(f"plan override {key} has no value")
            k, v = key[2:], rest[i + 1]
            i += 2
        overrides[k] = v
    return args, overrides


def truthy(value: str | bool) -> bool:
    return str(value).lower() in ("1", "true", "yes")
