"""The operations on pgqueue's tables, one store per kind of server (plain PostgreSQL, Citus).

The engine, the producers and `pgqueue.Admin` ask the store chosen when the
schema was detected; none of them asks which server it is.
"""
