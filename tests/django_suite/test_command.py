"""``manage.py pgqueue_worker`` takes every worker option's flag as ``pgqueue worker`` does."""

from __future__ import annotations

import argparse
from typing import Any

from pgqueue._extension import option_flags, option_values
from pgqueue.cli import build_parser
from pgqueue.django.management.commands.pgqueue_worker import Command

# Every option with a flag, in the several-queues form.
SEVERAL = [
    "--queue=a=2",
    "--queue=b=1",
    "--max-concurrency=3",
    "--global-limit=a=2",
    "--group-limit=b=1",
    "--rate-limit=a=10/1s:per-group",
    "--prefetch=1",
    "--poll-interval=2s",
    "--no-listen",
    "--backoff=pgqueue:default_backoff",
    "--rescue-after=1m",
    "--job-timeout=none",
    "--block-warning=2.5",
    "--unknown-types=dead",
    "--retain=7d",
    "--shutdown-grace=10s",
    "--middleware=pgqueue:default_backoff",
    "--observer=pgqueue:Observer",
    "--logger=my.app",
]
# And the one-queue form's.
ONE = ["--queue=q", "--concurrency=3", "--listen=postgresql://h/db"]


def django_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Command().create_parser(
        "manage.py", "pgqueue_worker"
    )
    return parser


def worker_parser() -> argparse.ArgumentParser:
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    parser: argparse.ArgumentParser = commands.choices["worker"]
    return parser


def option_dests(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each shown flag of a parser that lands under a worker option, with that option."""
    options = set(option_flags())
    return {
        flag: action.dest
        for action in parser._actions
        if action.dest in options and action.help != argparse.SUPPRESS
        for flag in action.option_strings
    }


def test_both_commands_have_the_same_option_flags() -> None:
    ours, theirs = option_dests(django_parser()), option_dests(worker_parser())
    assert ours == theirs
    # Every option with a flag has it (queues by --queue NAME=N).
    assert set(ours.values()) == set(option_flags()) - {"queues"}


def test_both_commands_read_the_same_flags_as_the_same_options() -> None:
    for argv in (SEVERAL, ONE):
        ours: dict[str, Any] = option_values(django_parser().parse_args(argv))
        theirs = option_values(worker_parser().parse_args(["app:worker", *argv]))
        assert ours == theirs
    assert set(option_values(django_parser().parse_args(SEVERAL))) | {
        "queue",
        "concurrency",
    } == set(option_flags())
