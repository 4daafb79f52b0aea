"""The forward pass: backbone + reward head on encoded inputs, and nothing of preprocessing.

- ``model``: the head, batches (packed, or right-padded), embedding with the image features, the
  last-token readout (``forward_rewards``);
- ``prefix``: shared-context group scoring (one prefill, candidate suffixes against its KV);
- ``vision``: the vision tower without per-image loops;
- ``batching``: token-budget planning (pure);
- ``pixels``: uint8 patches -> the processor's float32 values, on the model's device.

Inputs come from the engine (``nvrm.engine``) as plain tensors; nothing here imports it.
"""
