"""Asynchronous work: submit now, fetch later (``job_service``), kept in this process (``local_store``) or in Redis
for every replica (``redis_store``, ``shared_jobs``)."""
