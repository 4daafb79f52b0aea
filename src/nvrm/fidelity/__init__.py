"""The fidelity oracle: what the runtime's rewards are checked against, and how closely.

- ``reference``: a deliberately plain implementation of the release contract that shares no code with the
  runtime's preprocessing (parity and golden tests compare against it; ``nvrm bench`` runs it as the naive path);
- ``numerics``: bf16 ulps, the drift bounds every test imports, and the machine facts a reward's last bits depend on.

Until 0.5 these were ``nvrm.bench.reference`` and ``nvrm.bench.numerics``; those paths still import, with a
DeprecationWarning, until 0.6. Nothing is imported here: ``reference`` needs torch, PyAV and transformers.
"""
