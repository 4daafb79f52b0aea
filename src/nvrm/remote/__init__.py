"""The client's machinery (``nvrm.client.RewardClient`` is its face): request bodies and their
exchange plans (``bodies``), HTTP with retries and bounds (``http``). Torch-free."""
