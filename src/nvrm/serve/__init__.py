"""The reward service: HTTP API, dynamic batching across requests, shared contexts, limits, metrics.

It imports the scoring library; the library never imports it. The face (this folder's own modules) holds the
settings (``config``), the metrics, the logic object (``serving``), the app (``app``) and the process
(``launcher``: ``launch(model_or_loader, config)``, what ``nvrm serve`` calls). Each sub-folder is one room:

- ``http/``: reading bodies, the middleware (auth, metrics, JSON errors), replies, shared error responses;
- ``admission/``: decoding requests and their media, the byte budget, giving memory back;
- ``batching/``: the scheduler, the scorer thread's execution, the kept contexts and prefixes;
- ``models/``: the named models and their weights, swapping them (``PUT /v1/models/NAME``, ``--watch``);
- ``jobs/``: submit now, fetch later, in this process or in Redis for every replica;
- ``protocols/``: nvrm's ``/v1``, UniRL, verl-omni's DRM scorer, cosmos-rl's reward service;
- ``ray/``: the same app as Ray Serve replicas, swaps rolled over them.
"""

from .config import ServeConfig
from .launcher import launch

__all__ = ["ServeConfig", "launch"]
