"""pgqueue's own connections to the server, besides the application's pool.

`connections` (`pgqueue.Connections`, shared by a process's parts or made
by each part for itself), over `dedicated` (one reconnecting connection for
statements) and `listener` (one reconnecting LISTEN connection, shared by
routes), over `opening` (a new connection like a pool's, or from a DSN).
"""
