"""pgqueue.django on a real server: enqueue in a view's transaction, a real worker, the results."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection, transaction
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.test import Client, override_settings
from django.utils import timezone
from shop.models import Order
from shop.tasks import PaymentDeclinedError, attempt, charge, send_receipt, ship, total

import pgqueue
import pgqueue.django
from pgqueue import PgQueueError, SchemaError
from pgqueue.django import (
    JOB_TYPE,
    JobFailed,
    TaskFailed,
    database_dsn,
    pgqueue_priority,
)
from tests.django_suite.conftest import PROJECT, Process, wait_until
from tests.django_suite.tasks import now
from tests.go_module import GO_SCHEMA

if TYPE_CHECKING:
    from pathlib import Path

PROMPTLY = 10.0  # seconds; the worker polls only every 60


def jobs() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgqueue_jobs")
        (count,) = cursor.fetchone()
    return int(count)


def table_exists() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('pgqueue_jobs') IS NOT NULL")
        (exists,) = cursor.fetchone()
    return bool(exists)


def finished(result_id: str) -> Any:
    def check() -> Any:
        result = default_task_backend.get_result(result_id)
        return result if result.is_finished else None

    return check


def test_the_migration_applies_reverses_and_upgrades_a_go_table() -> None:
    assert table_exists()
    call_command("migrate", "pgqueue", "zero", verbosity=0)
    assert not table_exists()

    # A table a Go producer made, holding its job: upgraded in place, kept.
    with connection.cursor() as cursor:
        cursor.execute(GO_SCHEMA)
        cursor.execute("INSERT INTO pgqueue_jobs (job_type) VALUES ('go.report')")
    call_command("migrate", "pgqueue", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_type, priority FROM pgqueue_jobs")
        assert cursor.fetchall() == [("go.report", 0)]
    # Reversing would drop the Go producer's job: refused.
    with pytest.raises(RuntimeError, match="not Django tasks"):
        call_command("migrate", "pgqueue", "zero", verbosity=0)
    assert table_exists()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_jobs")
    call_command("migrate", "pgqueue", "zero", verbosity=0)
    assert not table_exists()
    call_command("migrate", verbosity=0)
    assert table_exists()


def test_a_views_transaction_writes_the_order_and_a_woken_worker_runs_its_task(
    worker: Process,
) -> None:
    client = Client()
    started = time.monotonic()
    response = client.post(
        "/orders", {"item": "tea", "cents": 250}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert Order.objects.filter(pk=body["order"]).exists()

    result = wait_until(finished(body["task"]), PROMPTLY, "the receipt task")
    assert time.monotonic() - started < PROMPTLY  # NOTIFY, not the 60 s poll
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == {"order": body["order"], "item": "tea"}
    assert result.id == body["task"]
    assert result.args == [body["order"]]
    assert result.attempts == 1
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert Order.objects.get(pk=body["order"]).receipt_sent

    # The other ways to read it agree, and refresh() updates a stale one.
    assert send_receipt.get_result(body["task"]).return_value == result.return_value
    status = client.get(f"/tasks/{body['task']}").json()
    assert status == {
        "status": "SUCCESSFUL",
        "attempts": 1,
        "return_value": result.return_value,
    }

    stale = send_receipt.enqueue(body["order"])
    assert stale.status == TaskResultStatus.READY
    wait_until(finished(stale.id), PROMPTLY, "a second receipt")
    stale.refresh()
    assert stale.status == TaskResultStatus.SUCCESSFUL


def test_async_and_context_tasks_run(worker: Process) -> None:
    orders = [Order.objects.create(item="a", cents=c).pk for c in (100, 250)]
    summed = total.enqueue(orders)
    counted = attempt.enqueue()
    assert wait_until(finished(summed.id), PROMPTLY, "total").return_value == 350
    assert wait_until(finished(counted.id), PROMPTLY, "attempt").return_value == 1


def test_a_failing_task_is_failed_with_its_error_after_its_retries(
    worker: Process,
) -> None:
    result = charge.enqueue(7)
    failed = wait_until(finished(result.id), PROMPTLY, "the failing task")
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 2  # OPTIONS["MAX_ATTEMPTS"]
    [error] = failed.errors
    assert error.exception_class is PaymentDeclinedError
    assert error.exception_class_path == "shop.tasks.PaymentDeclinedError"
    assert "card declined for order 7" in error.traceback
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert failed.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = failed.return_value
    # Its priority (50) is pgqueue's 3; its queue is the task's.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, priority, job_type, status FROM pgqueue_jobs WHERE id = %s",
            [int(result.id)],
        )
        assert cursor.fetchone() == ("payments", 3, JOB_TYPE, "dead")


def test_the_errors_are_pgqueue_errors() -> None:
    assert issubclass(TaskFailed, PgQueueError)
    assert issubclass(JobFailed, PgQueueError)


def test_a_rolled_back_view_writes_nothing_and_wakes_no_worker() -> None:
    before_jobs, before_orders = jobs(), Order.objects.count()
    with psycopg.connect(database_dsn(), autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_jobs")
        client = Client(raise_request_exception=False)
        response = client.post(
            "/orders",
            {"item": "tea", "cents": 250, "fail": True},
            content_type="application/json",
        )
        assert response.status_code == 500
        # A NOTIFY sent after the rollback: any wakeup the rollback let
        # through would be delivered before it.
        with connection.cursor() as cursor:
            cursor.execute("NOTIFY pgqueue_jobs, 'sentinel'")
        payloads = []
        for notify in listener.notifies(timeout=PROMPTLY):
            payloads.append(notify.payload)
            if notify.payload == "sentinel":
                break
    assert payloads == ["sentinel"]
    assert (jobs(), Order.objects.count()) == (before_jobs, before_orders)


def test_bad_input_raises_before_anything_is_written() -> None:
    before = jobs()
    with transaction.atomic():
        with pytest.raises(TypeError, match="is not JSON"):
            send_receipt.enqueue(object())
        with pytest.raises(TypeError, match="is not JSON"):
            send_receipt.enqueue(timezone.now())
        with pytest.raises(InvalidTask, match="priority"):
            send_receipt.using(priority=101)
        with pytest.raises(InvalidTask, match="priority"):
            send_receipt.using(priority=-101)
        with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
            send_receipt.using(queue_name="nope")
        with pytest.raises(InvalidTask, match="aware"):
            send_receipt.using(run_after=timezone.now().replace(tzinfo=None))
    assert jobs() == before
    for bad in ("abc", "-1", "1.5", "99999999999999999999", str(10**6)):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(bad)


def test_run_after_priority_and_queue_reach_the_job() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = charge.using(run_after=later, priority=-100).enqueue(order_id=3)
    assert result.status == TaskResultStatus.READY
    assert result.task.run_after == later
    assert result.task.priority == -100
    assert result.kwargs == {"order_id": 3}
    again = charge.get_result(result.id)
    assert (again.task.run_after, again.task.priority, again.task.queue_name) == (
        later,
        -100,
        "payments",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT run_at, priority, payload::text FROM pgqueue_jobs WHERE id = %s",
            [int(result.id)],
        )
        run_at, priority, payload = cursor.fetchone()
        cursor.execute("DELETE FROM pgqueue_jobs WHERE id = %s", [int(result.id)])
    assert (run_at, priority) == (later, -5)
    assert json.loads(payload) == {
        "task": "shop.tasks.charge",
        "backend": "default",
        "args": [],
        "kwargs": {"order_id": 3},
        "priority": -100,
        "run_after": later.isoformat(),
    }


def test_priorities_keep_their_order_in_pgqueues_range() -> None:
    mapped = [pgqueue_priority(p) for p in range(-100, 101)]
    assert mapped == sorted(mapped)
    assert (mapped[0], mapped[100], mapped[-1]) == (-5, 0, 5)
    assert (pgqueue_priority(1), pgqueue_priority(-1), pgqueue_priority(20)) == (
        1,
        -1,
        1,
    )
    assert (pgqueue_priority(21), pgqueue_priority(81)) == (2, 5)


def test_pgqueue_worker_django_runs_the_tasks_and_never_shows_the_password() -> None:
    result = send_receipt.enqueue(Order.objects.create(item="b", cents=1).pk)
    env = dict(os.environ)
    dsn = urlsplit(env["PGQUEUE_DSN"])
    password = dsn.password
    if password is None:  # the test server trusts: any password will do
        password = "s3cret-pw"
        env["PGQUEUE_DSN"] = dsn._replace(
            netloc=f"{dsn.username}:{password}@{dsn.netloc.rpartition('@')[2]}"
        ).geturl()
    cli = subprocess.run(
        [sys.executable, "-m", "pgqueue", "worker", "--django", "--burst"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert (
        default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    )
    assert f"running the tasks of backend default from {dsn.username}@" in cli.stderr
    assert password not in cli.stderr


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_worker_logs_to_stderr_under_djangos_default_logging() -> None:
    result = send_receipt.enqueue(Order.objects.create(item="c", cents=1).pk)
    ran = _manage(
        "pgqueue_worker",
        "--burst",
        "--settings",
        "tests.django_suite.settings_unlogged",
    )
    assert ran.returncode == 0, ran.stderr
    assert " INFO pgqueue: worker starting" in ran.stderr, ran.stderr
    assert "INFO pgqueue: worker stopped" in ran.stderr, ran.stderr
    assert (
        default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    )


def test_the_checks_name_a_missing_app_and_an_empty_queues() -> None:
    assert not [m for m in checks.run_checks() if m.id.startswith("pgqueue.")]
    misconfigured = {
        "INSTALLED_APPS": ["shop"],
        "TASKS": {"default": {"BACKEND": "pgqueue.django.Backend", "QUEUES": []}},
    }
    with override_settings(**misconfigured):
        found = {m.id: m for m in checks.run_checks()}
    assert '"pgqueue.django" is not in INSTALLED_APPS' in found["pgqueue.E003"].msg
    assert "python manage.py migrate" in str(found["pgqueue.E003"].hint)
    assert "QUEUES is empty" in found["pgqueue.E004"].msg


def test_without_the_migration_check_enqueue_and_the_worker_say_to_migrate() -> None:
    call_command("migrate", "pgqueue", "zero", verbosity=0)
    try:
        messages = checks.run_checks(databases=["default"])
        [missing] = [m for m in messages if m.id == "pgqueue.W001"]
        assert "python manage.py migrate" in str(missing.hint)
        with pytest.raises(SchemaError, match=r"run python manage\.py migrate"):
            send_receipt.enqueue(1)
        worker = _manage("pgqueue_worker", "--burst")
        assert worker.returncode == 1, worker.stderr
        assert "pgqueue.W001" in worker.stderr
        assert "run python manage.py migrate" in worker.stderr
        assert "install(pool)" not in worker.stderr + str(missing.hint)
    finally:
        call_command("migrate", verbosity=0)
    assert table_exists()


def test_arguments_and_return_values_that_are_not_json_are_said_the_django_way(
    worker: Process,
) -> None:
    with pytest.raises(TypeError) as raised:
        send_receipt.enqueue(timezone.now())
    assert str(raised.value).startswith(
        "task shop.tasks.send_receipt: args[0] (datetime) is not JSON; "
        "Django's tasks take and return JSON values"
    )
    assert "json_encoder" not in str(raised.value)  # pgqueue's own advice
    result = now.enqueue()
    done = wait_until(finished(result.id), PROMPTLY, "the task failed")
    assert done.status == TaskResultStatus.FAILED
    traceback = done.errors[-1].traceback
    assert "task tests.django_suite.tasks.now returned what is not JSON" in traceback
    assert "Django's tasks take and return JSON values" in traceback


def test_database_options_reach_the_workers_connections() -> None:
    options = {
        "options": "-c statement_timeout=4321 --lock-timeout=1234",
        "application_name": "shop worker",
    }
    dsn = _dsn_with(options)

    async def shown() -> tuple[str, str, str]:
        connection = await asyncpg.connect(dsn)
        try:
            return (
                await connection.fetchval("SHOW statement_timeout"),
                await connection.fetchval("SHOW lock_timeout"),
                await connection.fetchval("SHOW application_name"),
            )
        finally:
            await connection.close()

    assert asyncio.run(shown()) == ("4321ms", "1234ms", "shop worker")
    for refused, match in (
        ({"assume_role": "app"}, "assume_role"),
        ({"options": "statement_timeout=1"}, "is not -c name=value"),
        ({"options": "-c nothing"}, "is not name=value"),
    ):
        with pytest.raises(ImproperlyConfigured, match=match):
            _dsn_with(refused)


def _dsn_with(options: dict[str, str]) -> str:
    """`database_dsn` of the default database with these OPTIONS (Django's connection unchanged)."""
    settings.DATABASES["with_options"] = {
        **settings.DATABASES["default"],
        "OPTIONS": options,
    }
    try:
        return database_dsn("with_options")
    finally:
        del settings.DATABASES["with_options"]


def _insert(queue: str, payload: dict[str, Any]) -> int:
    """A django.task job written by hand, as anyone who can insert could write it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts)"
            " VALUES (%s, %s, %s::jsonb, 2) RETURNING id",
            [queue, JOB_TYPE, json.dumps({"args": [], "kwargs": {}, **payload})],
        )
        (job_id,) = cursor.fetchone()
    return int(job_id)


def _row(job_id: int) -> tuple[str, int, str | None]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, attempts, last_error FROM pgqueue_jobs WHERE id = %s",
            [job_id],
        )
        status, attempts, error = cursor.fetchone()
    return status, int(attempts), error


def test_jobs_not_the_backends_are_dead_lettered_without_importing(
    tmp_path: Path,
) -> None:
    mark = tmp_path / "imported"
    probe = _insert("default", {"task": "tests.django_suite.probe.run"})
    shell = _insert("default", {"task": "os.system", "args": ["touch /tmp/owned"]})
    odd = _insert("default", {"task": "shop.tasks.send_receipt()\x1b"})
    other = _insert(
        "default", {"task": "tests.django_suite.tasks.now", "backend": "reports"}
    )
    # The other backend's own queue: this worker never takes it.
    theirs = _insert(
        "reports", {"task": "tests.django_suite.tasks.now", "backend": "reports"}
    )
    ours = send_receipt.enqueue(Order.objects.create(item="d", cents=1).pk)

    ran = _manage("pgqueue_worker", "--burst", PGQUEUE_PROBE_MARK=str(mark))
    assert ran.returncode == 0, ran.stderr
    assert not mark.exists()  # the probe's module was never imported
    assert (
        default_task_backend.get_result(ours.id).status == TaskResultStatus.SUCCESSFUL
    )
    for job_id, why in (
        (
            probe,
            "'tests.django_suite.probe.run' is not in TASKS['default']['OPTIONS']['TASK_MODULES']",
        ),
        (shell, "'os.system' is not in TASKS['default']['OPTIONS']['TASK_MODULES']"),
        (odd, "is not a task's import path"),
        (other, "it was enqueued through TASKS['reports']"),
    ):
        status, attempts, error = _row(job_id)
        # Dead at its first attempt (MAX_ATTEMPTS 2): retrying cannot help.
        assert (status, attempts) == ("dead", 1), error
        assert error is not None
        assert why in error
        assert "nothing was imported" in error
    assert _row(theirs)[0] == "pending"
    # Read back, another backend's job is none of this backend's.
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(other))
    with pytest.raises(InvalidTask, match="nothing was imported"):
        default_task_backend.get_result(str(probe))
    assert "tests.django_suite.probe" not in sys.modules

    # A worker of the backend takes none of another backend's queues.
    refused = _manage("pgqueue_worker", "--burst", "--queue", "reports")
    assert refused.returncode == 1
    assert "does not list the queues reports in QUEUES" in refused.stderr
    assert _row(theirs)[0] == "pending"
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_jobs WHERE id = %s", [theirs])


def test_tasks_come_from_the_installed_apps_unless_task_modules_says() -> None:
    def refused(path: str, **options: Any) -> bool:
        tasks = {
            "default": {
                "BACKEND": "pgqueue.django.Backend",
                "QUEUES": ["default"],
                "OPTIONS": options,
            }
        }
        with override_settings(TASKS=tasks):
            try:
                default_task_backend._task_path({"task": path}, "default")
            except InvalidTask:
                return True
            return False

    # By default, the packages of INSTALLED_APPS (shop, pgqueue.django).
    assert not refused("shop.tasks.charge")
    assert not refused("shop.elsewhere.deep.task")
    assert refused("tests.django_suite.tasks.now")
    assert refused("shopping.tasks.x")  # a name that starts like one is not one
    assert refused("os.system")
    # TASK_MODULES: only those modules, and the modules under them.
    assert not refused(
        "tests.django_suite.tasks.now", TASK_MODULES=["tests.django_suite.tasks"]
    )
    assert refused("shop.tasks.charge", TASK_MODULES=["tests.django_suite.tasks"])
    assert refused("shop.tasks.charge", TASK_MODULES="shop")  # not a list: none
    assert "tests.django_suite.probe" not in sys.modules


def test_the_checks_name_bad_task_modules_and_queues_two_backends_share() -> None:
    tasks = {
        "default": {
            "BACKEND": "pgqueue.django.Backend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"TASK_MODULES": "shop"},
        },
        "other": {"BACKEND": "pgqueue.django.Backend", "QUEUES": ["emails"]},
    }
    with override_settings(TASKS=tasks):
        found = {m.id: m for m in checks.run_checks() if m.id.startswith("pgqueue.")}
    assert set(found) == {"pgqueue.E005", "pgqueue.E006"}
    assert "TASK_MODULES'] is not a list of module names" in found["pgqueue.E005"].msg
    assert (
        "TASKS['default'] and TASKS['other'] share queues on database 'default': emails"
        in found["pgqueue.E006"].msg
    )


def _job(job_id: int) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max_attempts, unique_key, tracked, group_key, status,"
            " on_parent_failure, extract(epoch FROM run_at - created_at)::float8,"
            " ARRAY(SELECT parent_id FROM pgqueue_dependencies WHERE child_id = id)"
            " FROM pgqueue_jobs WHERE id = %s",
            [job_id],
        )
        names = ("max_attempts", "unique_key", "tracked", "group_key", "status")
        *values, on_parent_failure, due_in, parents = cursor.fetchone()
    return {
        **dict(zip(names, values, strict=True)),
        "on_parent_failure": on_parent_failure,
        "due_in": round(due_in),
        "parents": list(parents),
    }


def test_job_options_reach_the_job_each_field() -> None:
    parent = int(charge.enqueue(order_id=1).id)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"delay": 600}, {"due_in": 600}),
        ({"max_attempts": 9}, {"max_attempts": 9}),
        ({"unique_key": "k1"}, {"unique_key": "k1"}),
        ({"unique_key": "k2", "debounce": 90}, {"unique_key": "k2", "due_in": 90}),
        ({"track": True}, {"tracked": True}),
        ({"after": [parent]}, {"parents": [parent], "status": "waiting"}),
        (
            {"after": [parent], "on_parent_failure": "run"},
            {"on_parent_failure": "run"},
        ),
        ({"group": "customer:7"}, {"group_key": "customer:7"}),
    ]
    for options, shown in cases:
        with pgqueue.django.job_options(**options):
            job = _job(int(charge.enqueue(order_id=2).id))
        assert {name: job[name] for name in shown} == shown, options
    with (
        pgqueue.django.job_options(unique_key="k1", on_conflict="raise"),
        pytest.raises(pgqueue.DuplicateJobError),
    ):
        charge.enqueue(order_id=3)
    with transaction.atomic():
        with (
            pgqueue.django.job_options(after=[2**62]),
            pytest.raises(pgqueue.JobNotFoundError),
        ):
            charge.enqueue(order_id=4)
        assert jobs() > 0  # the transaction is still usable
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_jobs")


def test_job_options_leave_run_at_and_priority_to_the_task() -> None:
    for own in ({"run_at": timezone.now()}, {"priority": 1}):
        with pytest.raises(ValueError, match=r"task\.using"):
            pgqueue.django.job_options(**own).__enter__()


def test_a_task_that_takes_its_context_is_a_durable_handler(worker: Process) -> None:
    """``context.job``: a step recorded once, a sleep that gives the attempt back."""
    result = ship.enqueue(7)
    shipped = wait_until(finished(result.id), PROMPTLY, "the durable task")
    assert shipped.status == TaskResultStatus.SUCCESSFUL
    assert shipped.attempts == 1  # the sleep gave its attempt back
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT steps -> 'label' ->> 'result' FROM pgqueue_jobs WHERE id = %s",
            [int(result.id)],
        )
        [(recorded,)] = cursor.fetchall()
    # The replay returned the recorded label: the step ran once.
    assert recorded == shipped.return_value
    assert shipped.return_value.startswith("label-7-")
