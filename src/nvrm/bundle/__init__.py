"""Find, verify and load a WORL-NVRM bundle (release layout).

Layout: ``config.json`` (``Qwen3VLModel``), ``model-0000X-of-0000N.safetensors``
with ``model.safetensors.index.json`` (or one ``model.safetensors``),
``nvrm_head.safetensors`` (``rm_head.weight`` [1, hidden], optional
``rm_head.bias``), processor/tokenizer assets with the chat template, and
optionally ``RELEASE_MANIFEST.json`` / ``worl-bundle.json`` and
``nvrm_contract.json``.

Only safetensors are read (never pickle), no remote code runs, and loading is
strict: a missing, unexpected or mis-shaped weight is an error naming it.

Importing this package imports neither torch nor transformers: the functions that build a model or write
tensors import them when called, so ``nvrm verify`` and ``nvrm download`` start at once.
"""

from __future__ import annotations

from .layout import ACCEPTED_ARCHITECTURES, DEFAULT_REPO, HEAD_FILE, INDEX_FILE, MANIFEST_NAMES, cache_dir  # noqa: F401
from .verify import (  # noqa: F401
    DigestCache, IntegrityManifest, ManifestEntry, SCORING_FILES, VerifyReport, read_integrity_manifest, scoring_files, sha256_file, verify_bundle,
)
from .hub import download_bundle, resolve_bundle  # noqa: F401
from .load import (  # noqa: F401
    backbone_files, canonical_key, load_backbone, load_head, load_processor, preprocessing_fingerprint, raw_config, read_config, template_source,
    weights_fingerprint,
)
from .safetensors_header import HeaderError, TensorHeader, read_header  # noqa: F401
from .write import write_backbone, write_manifest  # noqa: F401
