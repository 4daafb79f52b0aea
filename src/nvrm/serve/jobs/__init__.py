"""Asynchronous work: submit now, fetch later. The service (``job_service``) knows kinds (``kinds``: parse, need, run,
answer), which protocols register, and one storage chosen at start (``storage``): in this process (``local_store``)
or in Redis for every replica (``redis_store``, ``shared_jobs``). ``job_routes``: ``/v1/jobs``."""
