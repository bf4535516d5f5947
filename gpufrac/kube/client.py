"""The official kubernetes client, configured once, with its exceptions mapped onto `gpufrac.kube.errors`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError as TransportError

from gpufrac.kube.errors import UnreachableError, api_error

# What the client raises when the API server cannot be reached at all: not an ApiException.
_UNREACHABLE = (TransportError, OSError)


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client for the given kubeconfig; without one, the in-cluster service account, then $KUBECONFIG or
    ~/.kube/config. Raises config.ConfigException when none of them is usable."""
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def _status_message(body: object) -> str:
    """The API server's own words from a Status body (why an eviction was refused, for instance); '' if none."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str):
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return message[:300] if isinstance(message, str) else ""


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run API calls, turning the client's exceptions into `gpufrac.kube.errors` that say `what` failed."""
    try:
        yield
    except ApiException as err:
        said = _status_message(err.body)
        detail = f": {said}" if said else ""
        raise api_error(int(err.status or 0), f"{what}: {err.status} {err.reason}{detail}") from err
    except _UNREACHABLE as err:
        raise UnreachableError(f"{what}: {err}") from err
