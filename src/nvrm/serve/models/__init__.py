"""Which models are served, at which weights, and swapping them under load: a model's digest (``weights``), the
registry of named models and its lease (``registry``), the served models as one object and the ``--model`` spec
(``served``), ``PUT /v1/models/NAME`` (``model_swap``), ``--watch`` (``model_watch``) and the routes
(``model_routes``)."""
