"""The reward service: HTTP API, dynamic batching across requests, shared contexts, limits, metrics.

It imports the scoring library; the library never imports it.

- ``launcher.py``: ``launch(model_or_loader, config)``: uvicorn, the signals, the one drain, the exit (``nvrm serve``);
- ``app.py``: ``create_app`` (state, middleware, routes, lifespan);
- ``routes.py`` / ``cosmos_routes.py`` / ``middleware.py``: one router per protocol (``/v1``, ``/v1/jobs``, cosmos-rl's
  ``/api/reward``); auth, metrics, JSON errors;
- ``transport.py`` / ``media.py``: bodies (JSON or multipart) and VIDEO objects, parsed off the event loop;
- ``scheduler.py`` / ``contexts.py``: cross-request batching, shared contexts, deadlines, drain;
- ``ray_serve.py``: the same app as Ray Serve replicas.
"""

from .config import ServeConfig
from .launcher import launch

__all__ = ["ServeConfig", "launch"]
