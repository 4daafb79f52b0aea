"""``nvrm serve``: the reward service on uvicorn, or as Ray Serve replicas (``--ray``)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from ..errors import ConfigError


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm serve``: model loading, every :class:`ServeConfig` field (generated) and the Ray Serve options."""
    from ..serve.config import ServeConfig
    from .model_flags import add_model_args
    from .options import add_dataclass_args, add_ray_args

    add_model_args(p, named=True, backends=True, monitored=True)
    add_dataclass_args(p, ServeConfig, group="service")
    ray = add_ray_args(p, what="replicas on one machine or a cluster", replica="the same app as Ray Serve replicas")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs reserved per replica")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def config_from_args(args: argparse.Namespace):
    """The ``ServeConfig`` the flags describe, with the bearer token read from ``--api-key-env``."""
    from ..serve.config import ServeConfig
    from .options import dataclass_from_args

    config = dataclass_from_args(args, ServeConfig)
    if config.api_key_env:
        key = os.environ.get(config.api_key_env)
        if not key:
            raise ConfigError(f"--api-key-env {config.api_key_env}: that environment variable is empty or unset")
        config = ServeConfig(**{**config.__dict__, "api_key": key})
    if config.admin_key_env:  # the model-swap key (PUT /v1/models/NAME), never the scoring key
        admin = os.environ.get(config.admin_key_env)
        if not admin:
            raise ConfigError(f"--admin-key-env {config.admin_key_env}: that environment variable is empty or unset")
        if admin == config.api_key:
            raise ConfigError(f"--admin-key-env {config.admin_key_env}: holds the scoring key; give swaps a key of their own")
        config = ServeConfig(**{**config.__dict__, "admin_key": admin})
    if not _is_loopback(config.host) and config.api_key is None:
        print(f"nvrm: warning: serving on {config.host} without --api-key-env: anyone who can reach it can use it", file=sys.stderr)
    return config


def run(args: argparse.Namespace) -> int:
    """``nvrm serve``: :func:`nvrm.serve.launch` over a background loader of ``--model`` (or Ray Serve with ``--ray``). Returns 0."""
    from .model_flags import backend_kwargs, settings_from_args

    from ..serve.models.served import NamedModels, parse_model_specs

    config = config_from_args(args)
    settings = settings_from_args(args)
    specs = parse_model_specs(args.model)  # one [(name, dir)] from here to every replica
    if args.ray and config.watch:
        raise ConfigError("--watch swaps on one server; with --ray each replica would swap on its own: "
                          "roll a swap over the replicas with PUT /v1/models/NAME (--admin-key-env) instead")
    backend = backend_kwargs(args)
    if args.ray and backend["backend"] != "nvrm":
        raise ConfigError("--backend vllm: Ray Serve replicas run nvrm's engine; serve vLLM with one nvrm serve per vLLM (or --vllm-url)")
    if args.ray:
        from ..serve.ray.deployment import serve_on_ray

        return serve_on_ray(specs, settings, config, replicas=args.replicas, gpus_per_replica=args.gpus_per_replica,
                            cpus_per_replica=args.cpus_per_replica, address=args.ray_address)
    from ..scoring.reward_model import RewardModel
    from ..serve import launch

    launch(NamedModels(specs, lambda where: RewardModel.from_pretrained(where, settings=settings, **backend)), config)
    return 0
