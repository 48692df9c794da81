"""Workers that ``tests/test_cli_worker.py`` runs with ``pgqueue worker``."""

from __future__ import annotations

RUNS = (
    "CREATE TABLE IF NOT EXISTS cli_runs"
    " (queue text NOT NULL, job_id bigint NOT NULL, pid int NOT NULL)"
)
"""Where the handler of ``tests.cli_apps.apps`` records each run."""
