"""The CPU attention kernel a process can run: torch's fused bf16 SDPA, or the math kernel where it crashes.

Read once per process by the scoring library and the reference alike (``ensure_cpu_sdpa``), so both
run the same kernel and their rewards stay comparable.
"""

from __future__ import annotations

import os

_SDPA_CHECKED = False
_SDPA_DEGRADED = False


def cpu_attention_degraded() -> bool:
    """Whether this process runs attention on the math kernel because of the AMX/capability bug below."""
    return _SDPA_DEGRADED


def ensure_cpu_sdpa() -> bool:
    """Keep bf16 attention on the CPU runnable when ATen's capability is set below the CPU's own.

    torch 2.14's fused CPU attention packs bf16 operands for AMX whenever the CPU has AMX, but the
    packing routine refuses to run unless ATen's capability is AVX-512; so with
    ``ATEN_CPU_CAPABILITY=avx2`` or ``default`` on an AMX machine every bf16 ``scaled_dot_product_attention``
    raises "pack_vnni2 is only supported when avx512 is supported". This probes one tiny call once per
    process; if it fails that way, the fused (flash) SDPA kernel is turned off for the process, so
    attention runs through the math kernel, in nvrm and in the reference alike (the process-wide flag is
    what both read). Returns whether the kernel is off for that reason (``cpu_attention_degraded``).
    """
    global _SDPA_CHECKED, _SDPA_DEGRADED
    if _SDPA_CHECKED:
        return _SDPA_DEGRADED
    _SDPA_CHECKED = True
    import logging

    import torch

    q = torch.zeros(1, 2, 300, 16, dtype=torch.bfloat16)  # big enough for the blocked kernel
    try:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return False
    except RuntimeError as e:
        if "pack_vnni" not in str(e):
            raise
    torch.backends.cuda.enable_flash_sdp(False)  # the process-wide flag; the CPU dispatcher reads it too
    _SDPA_DEGRADED = True
    logging.getLogger("nvrm").info(  # a debugging configuration: said with --verbose, not on every command
        "ATEN_CPU_CAPABILITY=%s on a CPU with AMX: torch's fused bf16 attention cannot run there, so this "
        "process uses the math attention kernel (rewards stay equal to the reference run in the same process)",
        os.environ.get("ATEN_CPU_CAPABILITY"),
    )
    return True
