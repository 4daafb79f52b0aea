"""``nvrm serve --ray``: the same app as Ray Serve replicas (``deployment``), swaps rolled over them one replica at a
time (``rolling_swap``)."""
