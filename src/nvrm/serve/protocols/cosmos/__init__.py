"""cosmos-rl's remote-reward protocol: its enqueue and pull bodies (``wire``), its routes (``cosmos_routes``), its job
kind (``rollout_kind``), and the Wan VAE that turns its latents into frames (``latents``), in worker processes on the
CPU (``decode_workers``)."""
