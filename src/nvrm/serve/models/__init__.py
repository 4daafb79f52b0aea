"""Which models are served, at which weights, and swapping them under load: the registry of named models
(``registry``), ``PUT /v1/models/NAME`` (``model_swap``), ``--watch`` (``model_watch``)."""
