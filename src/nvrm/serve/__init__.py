"""The reward service: HTTP API, dynamic batching across requests, shared contexts, limits, metrics.

It imports the scoring library; the library never imports it.

- ``app.py``: ``create_app`` (state, middleware, routes, lifespan);
- ``routes.py`` / ``middleware.py``: endpoints; auth, metrics, JSON errors;
- ``transport.py`` / ``media.py``: bodies (JSON or multipart) and VIDEO objects, parsed off the event loop;
- ``scheduler.py`` / ``contexts.py``: cross-request batching, shared contexts, deadlines, drain;
- ``ray_serve.py``: the same app as Ray Serve replicas.
"""

from .config import ServeConfig

__all__ = ["ServeConfig"]
