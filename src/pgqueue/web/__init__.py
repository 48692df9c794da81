"""A dashboard of pgqueue's queues in the browser (the ``web`` extra).

`create_app` returns an ASGI application (Starlette) to mount behind your own
authentication::

    from starlette.applications import Starlette
    from starlette.routing import Mount

    import pgqueue.web

    app = Starlette(routes=[Mount("/pgqueue", pgqueue.web.create_app(pool))])

or to serve alone with ``pgqueue web``. It is read-only unless built with
``read_only=False``. ``import pgqueue`` never imports this package (nor
Starlette).

.. versionadded:: 0.1
"""

from __future__ import annotations

from pgqueue.web._app import create_app

__all__ = ["create_app"]
