"""Every error nvrm raises on purpose.

Each message is one line that names the value that was seen and, where there
is one, the fix. The CLI prints ``str(error)`` and exits non-zero; it never
shows a traceback for these.
"""

from __future__ import annotations


class NvrmError(Exception):
    """Base class: an expected failure with a one-line, user-facing message."""

    exit_code = 2

    def __str__(self) -> str:  # keep messages on one line whatever was interpolated
        return " ".join(super().__str__().split())


class InputError(NvrmError, ValueError):
    """A video, clip or image handed to nvrm cannot be used.

    ``source`` names the input (a path, ``"<bytes>"``, ``"Clip"`` ...) and
    ``role`` says which slot it filled (``context`` or ``candidate``).
    """

    def __init__(self, source: str, reason: str, role: str | None = None):
        self.source = source
        self.reason = reason
        self.role = role
        where = f"{role} {source}" if role else source
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):  # survive the trip back from a worker process
        return (type(self), (self.source, self.reason, self.role))

    def with_role(self, role: str) -> "InputError":
        """The same error (same class and fields), saying which slot (context/candidate) the input filled."""
        if self.role is not None:
            return self
        import copy

        e = copy.copy(self)
        e.role = role
        e.args = (f"{role} {self.source}: {self.reason}",)
        return e


class ContractError(InputError):
    """The input decodes, but the release preprocessing contract cannot be met
    (too-short candidate, an aspect ratio the contract cannot encode, ...)."""


class BundleError(NvrmError):
    """A model bundle is missing files, has wrong weights or a bad config."""


class IntegrityError(BundleError):
    """A bundle file does not match its manifest (sha256 or size)."""


class DownloadError(NvrmError):
    """Fetching a bundle from the Hugging Face Hub failed."""


class InternalError(NvrmError):
    """An unexpected failure while handling one item: reported in its slot, never zero-filled."""

    @classmethod
    def wrap(cls, e: BaseException) -> "InternalError":
        """The one-line form every caller uses for an unexpected exception."""
        return cls(f"internal error: {type(e).__name__}: {e}")


class WorkerLost(InternalError):
    """A worker process ended during a task it held (a latent decode worker); the caller may start it again."""


class ModelError(InternalError):
    """The model produced something no result may carry (a non-finite reward): its weights are broken."""


class TrainingError(NvrmError):
    """Training cannot go on (a non-finite loss or gradient, a model not fit to export); the message names the step."""


class LimitError(InputError):
    """An input would exceed one of the work limits (``nvrm.Limits``); the message names it."""


class ConfigError(NvrmError, ValueError):
    """A setting (contract field, limit, load or service option) has an invalid value."""


class OutputError(NvrmError):
    """An output file cannot be written (disk full, file too large, permissions); what is written stays valid."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: cannot write ({reason}); free space or fix permissions, then run again with --resume")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


def _code(code: str | None, default: str) -> tuple[str, int]:
    """``code`` (else the ``default`` member, by name) as a ``protocol.ErrorCode``, with its HTTP status. Imported
    here, late: nvrm.protocol needs pydantic, and only the service raises the errors that carry a code."""
    from .protocol import ErrorCode

    member = ErrorCode[default] if code is None else ErrorCode._value2member_map_.get(code)
    if member is None:  # a code not in the vocabulary (yet): kept as given, with the default's status
        return str(code), ErrorCode[default].status
    return member, member.status  # type: ignore[return-value]


class RequestError(InputError):
    """A service request is malformed or not allowed: ``code`` (a ``protocol.ErrorCode``, default ``bad_request``)
    and its HTTP status (the code's own unless given)."""

    def __init__(self, where: str, reason: str, status: int | None = None, code: str | None = None):
        super().__init__(where, reason)
        self.code, own = _code(code, "BAD_REQUEST")
        self.status = own if status is None else status

    def __reduce__(self):
        return (type(self), (self.source, self.reason, self.status, self.code))


class Unavailable(NvrmError):
    """The service could not take or finish work, through no fault of the input (an HTTP status and a code)."""

    default_code = "UNAVAILABLE"
    """The ``protocol.ErrorCode`` member (by name) when no ``code`` is given."""

    def __init__(self, where: str, reason: str, status: int | None = None, code: str | None = None):
        self.source = where
        self.reason = reason
        self.code, own = _code(code, self.default_code)
        self.status = own if status is None else status
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.source, self.reason, self.status, self.code))


class BackendUnavailable(Unavailable):
    """The scoring backend (a vLLM engine or server) failed or did not answer: HTTP 503, ``backend_unavailable``; the
    service stays up and scores again once the backend is back."""

    default_code = "BACKEND_UNAVAILABLE"


class ShuttingDown(Unavailable):
    """The service is draining and takes no new work (HTTP 503, ``shutting_down``)."""

    default_code = "SHUTTING_DOWN"

    def __init__(self, where: str = "request", reason: str = "the server is shutting down; retry on another replica",
                 status: int | None = None, code: str | None = None):
        super().__init__(where, reason, status, code)


class Expired(Unavailable):
    """An item's request timed out before the item reached its forward pass (HTTP 504, ``timeout``)."""

    default_code = "TIMEOUT"

    def __init__(self, where: str = "item", reason: str = "its request timed out before it was scored", status: int | None = None,
                 code: str | None = None):
        super().__init__(where, reason, status, code)


class ServiceError(NvrmError):
    """The reward service refused or failed a whole request (after the client's retries)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code

    def __reduce__(self):
        return (type(self), (str(self), self.status, self.code))


class RemoteItemError(NvrmError):
    """One item the reward service could not score; ``code`` is the service's error code."""

    def __init__(self, index: int, code: str, message: str):
        super().__init__(f"item {index}: {message}")
        self.index = index
        self.code = code
        self.detail = message

    def __reduce__(self):
        return (type(self), (self.index, self.code, self.detail))


class RewardFnError(NvrmError):
    """Some items given to a reward function could not be scored; ``failures`` maps index -> message."""

    def __init__(self, failures: dict[int, str], total: int):
        self.failures = failures
        self.total = total
        first = "; ".join(f"[{i}] {m}" for i, m in list(failures.items())[:3])
        more = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        super().__init__(f"{len(failures)} of {total} item(s) failed: {first}{more}")

    def __reduce__(self):
        return (type(self), (self.failures, self.total))


class ZeroSignalWarning(RuntimeWarning):
    """An RL step whose rewards cannot carry a learning signal (identical candidates, equal rewards)."""


class Retryable(Exception):
    """A failure worth another try (connection trouble, 502/503/504); carries the last error (the client's retry policy)."""

    def __init__(self, error: ServiceError, retry_after: float | None):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class ServerFailed(NvrmError):
    """The reward server stopped because its model could not be loaded (``nvrm.serve.launch``); the message says why."""


class BackendError(ConfigError):
    """A scoring backend cannot do what was asked (vLLM not installed, a head_dim its kernels lack, exact or gradients from vLLM)."""


class RevisionMismatch(ServiceError):
    """An RL adapter pinned ``revision=``, and the served model is at another one (the server's 409, both revisions named)."""


class RefreshError(NvrmError):
    """A refresh cycle stage cannot finish this time (judgments not made, too few judged pairs); the message names the stage."""

    exit_code = 1
