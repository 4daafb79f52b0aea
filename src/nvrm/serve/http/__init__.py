"""HTTP plumbing shared by every route: reading bodies (``transport``), the middleware (one auth guard by path,
metrics, JSON errors), the messages routes answer with (``Reply``) and the shared error responses (``routing``)."""
