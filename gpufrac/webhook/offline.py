"""`gpufrac review`: what the API server would do with a manifest, offline.

A Pod goes through both webhooks as on CREATE (mutate, apply the patch, validate), or UPDATE with `old`; a workload
(Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, PodTemplate) through the validating webhook, which
judges its pod template and never changes it. Files hold any number of YAML or JSON documents (and `kind: List`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import jsonpatch
import yaml

from gpufrac.webhook.decide import admission, workloads
from gpufrac.webhook.decide.errors import BadReviewError
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.decide.review import ReviewRequest

STDIN = "-"
KINDS = ("Pod", *(w.kind for w in workloads.WORKLOADS))
_MAX_DOCUMENTS = 10_000  # a file of manifests, not a stream without end


class UnreadableError(Exception):
    """The input cannot be reviewed: one line, naming the file (and document) and the problem."""


@dataclass(frozen=True)
class OfflineResult:
    allowed: bool
    message: str
    warnings: list[str]
    patch: list[dict[str, Any]]
    object: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "message": self.message, "warnings": self.warnings, "patch": self.patch,
                "object": self.object}


@dataclass(frozen=True)
class Document:
    """One manifest of a file: where it is, and the object."""

    source: str  # a path, or "-" for standard input
    index: int  # 1-based, counting the documents of the file (and the items of a List)
    obj: Any

    @property
    def where(self) -> str:
        name = "standard input" if self.source == STDIN else self.source
        return f"{name}, document {self.index}"

    def describe(self) -> dict[str, Any]:
        metadata = self.obj.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
        return {"file": self.source, "document": self.index, "kind": self.obj.get("kind", "Pod"),
                "name": metadata.get("name", "")}


def _items(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict) and obj.get("kind") == "List" and isinstance(obj.get("items"), list):
        yield from obj["items"]
    elif obj is not None:
        yield obj


def read_documents(source: str, stdin: TextIO) -> list[Document]:
    """Every manifest in a file (or standard input): UnreadableError when it is not there, not YAML, or empty."""
    shown = "standard input" if source == STDIN else source
    try:
        if source == STDIN:
            text = stdin.read()
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableError(f"{shown}: cannot be read: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        loaded = [item for doc in yaml.safe_load_all(text) for item in _items(doc)]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UnreadableError(f"{shown}: is not YAML{at}: {problem}") from exc
    except RecursionError as exc:
        raise UnreadableError(f"{shown}: is nested too deeply") from exc
    if not loaded:
        raise UnreadableError(f"{shown}: holds no manifest")
    if len(loaded) > _MAX_DOCUMENTS:
        raise UnreadableError(f"{shown}: holds more than {_MAX_DOCUMENTS} manifests")
    return [Document(source, index, obj) for index, obj in enumerate(loaded, start=1)]


def _request(obj: dict[str, Any], old: dict[str, Any] | None, user: UserInfo, resource: str) -> ReviewRequest:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    return ReviewRequest(
        uid="offline", operation="UPDATE" if old is not None else "CREATE", kind=str(obj.get("kind", "Pod")),
        resource=resource, sub_resource="", namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")), user=user, obj=obj, old_obj=old, dry_run=True,
    )


def _review_pod(obj: dict[str, Any], old: dict[str, Any] | None, user: UserInfo, policy: Policy) -> OfflineResult:
    mutated = admission.mutate(_request(obj, old, user, "pods"), policy)
    if not mutated.allowed:
        return OfflineResult(False, mutated.message, mutated.warnings, [], obj)
    patched = jsonpatch.apply_patch(obj, mutated.patch)
    validated = admission.validate(_request(patched, old, user, "pods"), policy)
    return OfflineResult(validated.allowed, validated.message, mutated.warnings + validated.warnings,
                         mutated.patch, patched)


def review(obj: Any, old: Any, user: UserInfo, policy: Policy) -> OfflineResult:
    """One manifest. BadReviewError when it is not one of KINDS, or not an object the API server would take."""
    if not isinstance(obj, dict):
        raise BadReviewError(f"the manifest must be an object of kind {', '.join(KINDS)}")
    kind = obj.get("kind", "Pod")
    if kind not in KINDS:
        raise BadReviewError(f"kind {str(kind)[:64]} is not one gpufrac reviews; it reviews {', '.join(KINDS)}")
    if old is not None and (not isinstance(old, dict) or old.get("kind", "Pod") != kind):
        raise BadReviewError(f"the old manifest must be a single {kind}")
    if kind == "Pod":
        return _review_pod(obj, old, user, policy)
    workload = workloads.BY_KIND[kind]
    validated = admission.validate(_request(obj, old, user, workload.resource), policy)
    return OfflineResult(validated.allowed, validated.message, validated.warnings, [], obj)


def _old_object(old_source: str | None, documents: list[Document], stdin: TextIO) -> Any:
    if old_source is None:
        return None
    old_documents = read_documents(old_source, stdin)
    if len(old_documents) != 1 or len(documents) != 1:
        raise UnreadableError("--old compares one manifest with one: give a single document in each file")
    return old_documents[0].obj


def review_files(sources: list[str], old_source: str | None, user: UserInfo, policy: Policy,
                 stdin: TextIO) -> list[dict[str, Any]]:
    """Every manifest of every file, each as where it is plus its result. UnreadableError for input that cannot
    be reviewed: a missing file, YAML that does not parse, a kind gpufrac does not review, a malformed object."""
    if sources.count(STDIN) + (old_source == STDIN) > 1:
        raise UnreadableError("standard input (-) can be read once")
    documents = [document for source in sources for document in read_documents(source, stdin)]
    old = _old_object(old_source, documents, stdin)
    results = []
    for document in documents:
        try:
            result = review(document.obj, old, user, policy)
        except BadReviewError as exc:
            raise UnreadableError(f"{document.where}: {exc.message}") from exc
        except RecursionError as exc:
            raise UnreadableError(f"{document.where}: is nested too deeply") from exc
        results.append({**document.describe(), **result.as_dict()})
    return results
