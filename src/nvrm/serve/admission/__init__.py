"""What may come in, and what it costs: a request decoded into ``Work`` (``requests``), its VIDEO objects made safe
(``media``), its bytes reserved before they are held (``budget``), and freed memory given back (``memory``)."""
