"""The channels pgqueue sends on, and the statements that send on them from the coordinator."""

from __future__ import annotations

__all__ = [
    "ANNOUNCE",
    "CONTROL_CHANNEL",
    "JOBS_CHANNEL",
    "NOTIFY",
    "OUTCOMES_CHANNEL",
    "PUBLISH",
]

JOBS_CHANNEL = "pgqueue_jobs"
"""Wakeups: the queue's name, when a job may have become ready (as the Go module)."""

CONTROL_CHANNEL = "pgqueue_control"
"""Cancel requests: the id of a running job whose cancel was requested. Any
role may NOTIFY here, so a worker takes the id as a hint (see CANCEL_REQUESTED)."""

OUTCOMES_CHANNEL = "pgqueue_outcomes"
"""The id of a tracked job that has ended (completed, dead or cancelled)."""


# pgqueue.publish: a message $2 on channel $1.
PUBLISH = "SELECT pg_catalog.pg_notify($1, $2)"

# NOTIFYs on the coordinator (Citus), which a statement routed to a shard
# cannot send: channel $1[i], payload $2[i]; and the ids $1 of tracked jobs
# that ended, on pgqueue_outcomes.
NOTIFY = "SELECT pg_catalog.pg_notify(c, p) FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS n(c, p)"
ANNOUNCE = "SELECT pg_catalog.pg_notify('pgqueue_outcomes', id) FROM pg_catalog.unnest($1::text[]) AS id"
