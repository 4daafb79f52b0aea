"""The wire protocols the service speaks, each one shape (``spec.ProtocolSpec``: decode, encode, endpoints): nvrm's
own ``/v1`` (``native``), UniRL (``unirl``), verl-omni's DRM scorer (``drm``) and cosmos-rl's reward service
(``cosmos``)."""
