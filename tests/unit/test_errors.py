"""The errors module: every error keeps its class and fields when it learns its slot; service states are not input errors."""

from __future__ import annotations

import pickle

from nvrm.errors import ContractError, Expired, InputError, LimitError, RequestError, ShuttingDown, Unavailable
from nvrm.results import error_code


def test_with_role_keeps_the_class_and_fields_of_every_input_error():
    for e in (InputError("a.mp4", "bad"), ContractError("a.mp4", "short"), LimitError("a.mp4", "big"), RequestError("body", "oops", 413, "too_large")):
        got = e.with_role("candidate")
        assert type(got) is type(e) and got.role == "candidate" and str(got).startswith("candidate ")
        assert getattr(got, "status", None) == getattr(e, "status", None)


def test_service_states_are_not_input_errors_and_keep_their_codes():
    for e, code, status in ((ShuttingDown(), "shutting_down", 503), (Expired(), "timeout", 504)):
        assert isinstance(e, Unavailable) and not isinstance(e, InputError)
        assert error_code(e) == code and e.status == status
        back = pickle.loads(pickle.dumps(e))  # crosses process boundaries intact
        assert type(back) is type(e) and str(back) == str(e)
