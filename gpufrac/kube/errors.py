"""What a Kubernetes API call can fail with, as the programs handle it (no client types: callers need not import
the kubernetes package to catch them). `gpufrac.kube.client.translated` raises these."""

from __future__ import annotations


class KubeError(Exception):
    """A Kubernetes API call failed; the message says what was being done and the status."""


class UnreachableError(KubeError):
    """The API server could not be reached at all (down, restarting, no route): worth retrying."""


class ApiError(KubeError):
    """The API server answered with an error status."""

    STATUS = 0

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = self.STATUS if status is None else status


class NotFoundError(ApiError):
    """404: the object does not exist."""

    STATUS = 404


class ConflictError(ApiError):
    """409: the object exists already, or changed since it was read (resourceVersion)."""

    STATUS = 409


class GoneError(ApiError):
    """410: a watch's resourceVersion is too old; relist."""

    STATUS = 410


class TooManyRequestsError(ApiError):
    """429: refused for now (rate limit, or an eviction a PodDisruptionBudget blocks)."""

    STATUS = 429


_BY_STATUS: dict[int, type[ApiError]] = {e.STATUS: e for e in (NotFoundError, ConflictError, GoneError,
                                                                 TooManyRequestsError)}


def api_error(status: int, message: str) -> ApiError:
    """The error type for an HTTP status."""
    return _BY_STATUS.get(status, ApiError)(message, status)
