"""One error vocabulary: every code the service sends and the client reads is a ``protocol.ErrorCode``, written once."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest

from nvrm.errors import Expired, RequestError, ShuttingDown, Unavailable
from nvrm.protocol import INPUT_CODES, ErrorCode

SRC = Path(__file__).resolve().parents[2] / "src" / "nvrm"
PENDING: dict[str, str] = {}
"""file -> why it still writes a code as a string (to be emptied, not grown)."""


def test_every_code_has_one_value_and_an_error_status():
    values = [c.value for c in ErrorCode]
    assert len(values) == len(set(values))
    assert all(400 <= c.status < 600 for c in ErrorCode)
    assert ErrorCode("overloaded").status == 503 and ErrorCode.TOO_LARGE == "too_large"
    assert json.dumps({"code": ErrorCode.TIMEOUT}) == '{"code": "timeout"}' and f"{ErrorCode.TIMEOUT}" == "timeout"
    assert INPUT_CODES <= set(ErrorCode)


@pytest.mark.parametrize("error, code, status", [
    (RequestError("body", "is bad"), ErrorCode.BAD_REQUEST, 400),
    (RequestError("body", "is big", code=ErrorCode.TOO_LARGE), ErrorCode.TOO_LARGE, 413),
    (RequestError("ref", "is unknown", status=409, code=ErrorCode.CONTEXT_UNKNOWN), ErrorCode.CONTEXT_UNKNOWN, 409),
    (ShuttingDown(), ErrorCode.SHUTTING_DOWN, 503),
    (Expired(), ErrorCode.TIMEOUT, 504),
    (Unavailable("store", "is down"), ErrorCode.UNAVAILABLE, 503),
])
def test_errors_carry_a_code_and_its_status_through_a_pickle(error, code, status):
    for e in (error, pickle.loads(pickle.dumps(error))):
        assert (e.code, e.status) == (code, status) and e.code is code


def test_a_code_from_a_newer_server_is_kept_as_sent():
    assert ErrorCode.read("overloaded") is ErrorCode.OVERLOADED
    assert ErrorCode.read("brand_new") == "brand_new" and ErrorCode.read(None) is None
    assert Unavailable("x", "y", code="brand_new").code == "brand_new"


def test_no_code_string_is_written_outside_the_protocol():
    """The server (serve/), the client's transport (remote/) and the client name codes as ``ErrorCode.X``."""
    codes = {c.value for c in ErrorCode}
    files = [*sorted((SRC / "serve").rglob("*.py")), *sorted((SRC / "remote").glob("*.py")), SRC / "client.py"]
    found = []
    for path in files:
        rel = path.relative_to(SRC).as_posix()
        if rel in PENDING:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in codes:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, f"write these as protocol.ErrorCode members: {found}"
