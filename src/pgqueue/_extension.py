"""The private names the extras may use: the one door from them into pgqueue's internals.

The extras (`pgqueue.cli`, `pgqueue.web`, `pgqueue.prometheus`,
`pgqueue.otel`, `pgqueue.testing`, `pgqueue.sync`, `pgqueue.sqlalchemy` and
`pgqueue.django`) import public names from `pgqueue` and private ones from
here, never from another private module. So this module is the list of
what they lean on: input checks, the connection's target, error text, the
SQL enqueue's call and checks, the statements and the pure code around them
for other drivers (enqueue_many's batch, the admin's rows, the rows the
Django backend reads), the dashboards' frames, the schema check, log
formatting. The
worker's engine (claimer, policy, ledger, lanes, runner, writer, consumers,
upkeep, leases, listener...) is never in it: an extra drives a `pgqueue.Worker`
or watches one through its public hooks. The import contracts in
``pyproject.toml`` (run ``lint-imports``) hold both rules.
"""

from __future__ import annotations

from pgqueue._admin import (
    PREVIEW_CHARS,
    QUEUE_COUNTS,
    STEPS_SHOWN,
    completed_estimated,
    durable_details,
    job_info,
    listing,
    queue_stats,
)
from pgqueue._core.checks import (
    check_channel,
    check_dsn_or_pool,
    check_duration,
    check_group,
    check_int,
    check_job_id,
    check_job_type,
    check_max_attempts,
    check_name,
    check_on_conflict,
    check_origin,
    check_priority,
    check_queue_name,
    check_signal,
    check_unique_key,
)
from pgqueue._core.codec import (
    encode_payload,
    encode_payloads,
    payload_encoder,
    unencodable,
)
from pgqueue._core.dsn import check_dsn, holds_password, target, target_of
from pgqueue._core.errors import DATABASE_ERRORS, describe
from pgqueue._core.flags import (
    DURATION_EXAMPLES,
    FlagError,
    add_option_flags,
    duration,
    option_values,
    optional_duration,
    optional_int,
    resolve,
    seconds_of,
)
from pgqueue._core.job import PeriodicKey
from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._core.log import JsonFormatter, default_logger
from pgqueue._core.options import Flag, option_flags
from pgqueue._core.public import public_names
from pgqueue._core.request import check_jobs, check_request
from pgqueue._core.text import (
    CONTROL_CHARACTERS,
    SHOWN_NAME_CHARS,
    clipped,
    first_line,
    printable,
    run_time_text,
    seconds_text,
    shown_name,
)
from pgqueue._dashboard import QUEUES_SHOWN, Frame, Sampler
from pgqueue._queue import encode_batch, enqueue_batch, enqueue_request, queue_on
from pgqueue._sql import (
    admin as admin_statements,
)
from pgqueue._sql import (
    clock as clock_statements,
)
from pgqueue._sql import (
    dashboard as dashboard_statements,
)
from pgqueue._sql import (
    durable as durable_statements,
)
from pgqueue._sql import (
    durable_view as durable_view_statements,
)
from pgqueue._sql import (
    listings as listing_statements,
)
from pgqueue._sql import (
    schema as schema_statements,
)
from pgqueue._sql.grants import KINDS as GRANT_KINDS
from pgqueue._sql.listings import FOREIGN_JOBS_PYFORMAT, JOB_PYFORMAT, JOB_STATUSES
from pgqueue._sql.literals import array, pyformat
from pgqueue._sql.schema import SERVER_IDENTITY, TABLE_EXISTS
from pgqueue._store.plan import Enqueued, Plan
from pgqueue._store.postgres import Store
from pgqueue._store.schema import (
    DEPENDENCIES_MISSING,
    REPLACE_MISSING,
    SCHEMA_ERRORS,
    check_schema,
    schema_error,
    store_on,
)
from pgqueue._trend import step_of as trend_step

__all__ = [
    "CONTROL_CHARACTERS",
    "DATABASE_ERRORS",
    "DEPENDENCIES_MISSING",
    "DURATION_EXAMPLES",
    "FOREIGN_JOBS_PYFORMAT",
    "GRANT_KINDS",
    "JOB_PYFORMAT",
    "JOB_STATUSES",
    "PREVIEW_CHARS",
    "QUEUES_SHOWN",
    "QUEUE_COUNTS",
    "REPLACE_MISSING",
    "SCHEMA_ERRORS",
    "SERVER_IDENTITY",
    "SHOWN_NAME_CHARS",
    "STEPS_SHOWN",
    "TABLE_EXISTS",
    "Enqueued",
    "Flag",
    "FlagError",
    "Frame",
    "JsonFormatter",
    "OutcomeKind",
    "PeriodicKey",
    "Plan",
    "Sampler",
    "Store",
    "add_option_flags",
    "admin_statements",
    "array",
    "check_channel",
    "check_dsn",
    "check_dsn_or_pool",
    "check_duration",
    "check_group",
    "check_int",
    "check_job_id",
    "check_job_type",
    "check_jobs",
    "check_max_attempts",
    "check_name",
    "check_on_conflict",
    "check_origin",
    "check_priority",
    "check_queue_name",
    "check_request",
    "check_schema",
    "check_signal",
    "check_unique_key",
    "clipped",
    "clock_statements",
    "completed_estimated",
    "dashboard_statements",
    "default_logger",
    "describe",
    "durable_details",
    "durable_statements",
    "durable_view_statements",
    "duration",
    "encode_batch",
    "encode_payload",
    "encode_payloads",
    "enqueue_batch",
    "enqueue_request",
    "first_line",
    "holds_password",
    "job_info",
    "listing",
    "listing_statements",
    "option_flags",
    "option_values",
    "optional_duration",
    "optional_int",
    "payload_encoder",
    "printable",
    "public_names",
    "pyformat",
    "queue_on",
    "queue_stats",
    "resolve",
    "run_time_text",
    "schema_error",
    "schema_statements",
    "seconds_of",
    "seconds_text",
    "shown_name",
    "store_on",
    "target",
    "target_of",
    "trend_step",
    "unencodable",
]
