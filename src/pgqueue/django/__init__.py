"""A backend for Django's tasks framework (``django.tasks``, Django 6) on pgqueue.

::

    INSTALLED_APPS = [..., "pgqueue.django"]  # the schema, as a migration
    TASKS = {"default": {"BACKEND": "pgqueue.django.Backend", "QUEUES": ["default"]}}

``my_task.enqueue(...)`` writes a job in the transaction of Django's own
connection; ``python manage.py pgqueue_worker`` (or ``pgqueue worker
--django``) runs the tasks; ``my_task.get_result(id)`` reads the job back.
Needs Django 6 (Python 3.12 or newer): ``pip install
'pgqueue-asyncio[django]'``.
"""

from __future__ import annotations

from pgqueue.django._backend import Backend, job_options, pgqueue_priority
from pgqueue.django._outcome import JOB_TYPE, JobFailed, TaskFailed
from pgqueue.django._runner import JobContext, database_dsn, run_worker, worker

__all__ = [
    "JOB_TYPE",
    "Backend",
    "JobContext",
    "JobFailed",
    "TaskFailed",
    "database_dsn",
    "job_options",
    "pgqueue_priority",
    "run_worker",
    "worker",
]
