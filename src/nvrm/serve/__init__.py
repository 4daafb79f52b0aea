"""The reward service: HTTP API, dynamic batching across requests, limits, metrics.

It imports the scoring library; the library never imports it.
"""

from .config import ServeConfig

__all__ = ["ServeConfig", "create_app"]


def create_app(*args, **kwargs):
    from .app import create_app as _create

    return _create(*args, **kwargs)
