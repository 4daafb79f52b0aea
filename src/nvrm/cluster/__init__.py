"""Running nvrm's work as Ray tasks: what its Ray Data pipelines share (``nvrm batch --ray`` in
``nvrm.batch.ray_runner``, ``nvrm prefs prepare --ray`` in ``nvrm.train.ray_store``), so neither imports the other.

Ray is imported only when a pipeline runs (``ray_tasks.require_ray``)."""
