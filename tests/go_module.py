"""The Go module v1.1.0's schema and statements, as it runs them (in meaning).

Tests run them beside pgqueue's on the same rows: a table the Go module
created, jobs its producers wrote, claims and outcomes of its workers.
"""

# The Go module v1.1.0's pgqueue.Schema.
from __future__ import annotations

GO_SCHEMA = """
CREATE TABLE pgqueue_jobs
(
    id           BIGSERIAL PRIMARY KEY,
    queue        TEXT        NOT NULL DEFAULT 'default',
    job_type     TEXT        NOT NULL,
    payload      JSONB       NOT NULL DEFAULT '{}'::jsonb,
    status       TEXT        NOT NULL DEFAULT 'pending'
        CONSTRAINT chk_pgqueue_jobs_status CHECK (status IN ('pending', 'running', 'completed', 'dead')),
    attempts     INT         NOT NULL DEFAULT 0,
    max_attempts INT         NOT NULL DEFAULT 5,
    run_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at TIMESTAMPTZ
);

CREATE INDEX idx_pgqueue_jobs_claim ON pgqueue_jobs (queue, run_at, id) WHERE status = 'pending';
CREATE INDEX idx_pgqueue_jobs_rescue ON pgqueue_jobs (updated_at) WHERE status = 'running';
"""

# Its Enqueue: the row and its wake-up in one statement.
GO_ENQUEUE = """
WITH job AS (
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at)
    VALUES ($1, $2, $3, $4, now()) RETURNING id
)
SELECT job.id FROM job, pg_notify('pgqueue_jobs', $1)
"""
# The same row without the wake-up, for a run_at of the caller's.
GO_INSERT = """
INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at)
VALUES ($1, $2, $3, $4, $5) RETURNING id
"""
# Its worker's claim, fenced outcome writes ($1 id, $2 attempts) and rescue.
GO_CLAIM = """
UPDATE pgqueue_jobs
SET status = 'running', attempts = attempts + 1, updated_at = now()
WHERE id IN (
    SELECT id FROM pgqueue_jobs
    WHERE queue = $1 AND status = 'pending' AND run_at <= now()
    ORDER BY run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
RETURNING id, queue, job_type, payload, attempts, max_attempts, run_at, created_at, COALESCE(last_error, '')
"""
GO_COMPLETE = (
    "UPDATE pgqueue_jobs SET status = 'completed', completed_at = now(), updated_at = now()"
    " WHERE id = $1 AND status = 'running' AND attempts = $2"
)
GO_RETRY = (
    "UPDATE pgqueue_jobs SET status = 'pending', run_at = now(), last_error = $3,"
    " updated_at = now() WHERE id = $1 AND status = 'running' AND attempts = $2"
)
GO_DEAD = (
    "UPDATE pgqueue_jobs SET status = 'dead', last_error = $3, updated_at = now()"
    " WHERE id = $1 AND status = 'running' AND attempts = $2"
)
GO_RESCUE = """
UPDATE pgqueue_jobs
SET status = CASE WHEN attempts < max_attempts THEN 'pending' ELSE 'dead' END,
    last_error = CASE WHEN attempts < max_attempts THEN last_error
                      ELSE 'rescued after exceeding max attempts' END,
    updated_at = now()
WHERE status = 'running' AND updated_at < now() - make_interval(secs => $1)
"""
# Its Queue.Prune (WorkerConfig.Retain runs the same): the queue's ($1)
# completed and dead rows last updated over $2 seconds ago, nothing else.
GO_PRUNE = """
DELETE FROM pgqueue_jobs
WHERE queue = $1 AND status IN ('completed', 'dead')
  AND updated_at < now() - make_interval(secs => $2)
"""
