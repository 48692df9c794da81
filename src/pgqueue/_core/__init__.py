"""The floors: what knows nothing of workers, queues or connections.

The job and its outcome (`job`, `outcome`), errors (`errors`), input checks
(`checks`), payload codecs (`codec`, `typed`), the handler and hook types
(`handler`, `hooks`), the retry rules (`backoff`, `retry`), the worker's
options (`options`), the schema (`schema`) and all of pgqueue's SQL (`sql`).
"""
