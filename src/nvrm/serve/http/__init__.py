"""HTTP plumbing shared by every route: reading and parsing request bodies (``request_bodies``), the middleware (one
bearer guard by path, metrics, JSON errors), what routes hand around (``messages``: ``Reply``, ``PendingBody``) and
what every router shares (``routing``: the documented error responses, ``respond``)."""
