"""How admitted work meets the model: the scheduler batches items across requests (``scheduler``), the scorer
thread runs them (``execution``), and prepared contexts and prefixes are kept by content (``contexts``, ``lru``)."""
