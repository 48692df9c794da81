"""Every SQL statement pgqueue runs, by concept: one module a concept.

Each statement for a distributed (Citus) schema is written beside the
plain one, from the same source.
"""
