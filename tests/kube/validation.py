"""What the API server refuses (422 Invalid, in a dry run too) of the names and labels of the
kinds the backend creates, each rule written out from Kubernetes' own validation — the code under
test has its own, so the two are compared, never shared."""

from __future__ import annotations

import re
from typing import Any

# The name rules of k8s.io/apimachinery/pkg/util/validation, written out here (the code under test
# has its own): IsDNS1123Label, IsDNS1035Label, IsDNS1123Subdomain, IsValidLabelValue and the name
# part of IsQualifiedName.
_DNS1123_LABEL = (re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"), 63, "a lowercase RFC 1123 label must consist of "
                  "lower case alphanumeric characters or '-', and must start and end with an alphanumeric character")
_DNS1035_LABEL = (re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?"), 63, "a DNS-1035 label must consist of lower case "
                  "alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric "
                  "character")
_DNS1123_SUBDOMAIN = (re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"), 253,
                      "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                      "and must start and end with an alphanumeric character")
_LABEL_VALUE = (re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"), 63, "a valid label must be an empty "
                "string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character")
_QUALIFIED_NAME = (re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"), 63, "name part must consist of "
                   "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
#: pkg/apis/core/validation: ValidateService names with ValidateServiceName (NameIsDNS1035Label),
#: ValidateConfigMap with ValidateConfigMapName and ValidateSecret with ValidateSecretName
#: (NameIsDNSSubdomain); pkg/apis/batch/validation.ValidateJob with ValidateReplicationControllerName
#: (NameIsDNSSubdomain).
NAME_RULES = {"Service": _DNS1035_LABEL, "ConfigMap": _DNS1123_SUBDOMAIN, "Secret": _DNS1123_SUBDOMAIN,
              "Job": _DNS1123_SUBDOMAIN}


def _broken(value: str, rule: tuple[re.Pattern[str], int, str]) -> str | None:
    pattern, longest, said = rule
    if len(value) > longest:
        return f"must be no more than {longest} characters"
    return None if pattern.fullmatch(value) else said


def _qualified_name(key: str) -> str | None:
    """IsQualifiedName: an optional DNS-1123 subdomain prefix and ``/``, then a name part."""
    prefix, slash, name = key.rpartition("/")
    if slash and (problem := _broken(prefix, _DNS1123_SUBDOMAIN)):
        return f"prefix part {problem}"
    return _broken(name, _QUALIFIED_NAME)


def _labels(labels: dict[str, str], where: str) -> list[str]:
    """apimachinery/pkg/apis/meta/v1/validation.ValidateLabels: qualified keys, valid values."""
    problems = []
    for key, value in labels.items():
        if problem := _qualified_name(key):
            problems.append(f"{where}: Invalid value: {key!r}: {problem}")
        if problem := _broken(str(value), _LABEL_VALUE):
            problems.append(f"{where}: Invalid value: {value!r}: {problem}")
    return problems


def invalid(obj: dict[str, Any]) -> list[str]:
    """Why a real API server refuses to create ``obj`` (empty: it does not) — for what this
    project creates: each kind's name rule (:data:`NAME_RULES`); labels (``ValidateLabels``) and
    annotation keys (apimachinery/pkg/api/validation.ValidateAnnotations); and for a Job what
    pkg/apis/batch/validation.ValidateJob checks after pkg/registry/batch/job/strategy.go's
    generateSelector has labelled the pod template with the Job's name (``job-name`` and
    ``batch.kubernetes.io/job-name``, so the name must be a label value, at most 63 characters):
    the template's labels, its pod's ``subdomain`` and ``hostname`` as DNS-1123 labels
    (pkg/apis/core/validation.ValidatePodSpec), and for an Indexed Job ``<name>-<completions - 1>``,
    the last pod's hostname, as a DNS-1123 label."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", ""))
    problems = []
    if problem := _broken(name, NAME_RULES[obj["kind"]]):
        problems.append(f"metadata.name: Invalid value: {name!r}: {problem}")
    problems += _labels(metadata.get("labels") or {}, "metadata.labels")
    problems += [f"metadata.annotations: Invalid value: {key!r}: {problem}"
                 for key in metadata.get("annotations") or {} if (problem := _qualified_name(key))]
    if obj["kind"] == "Job":
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        labels = {**(template.get("metadata") or {}).get("labels", {}), "job-name": name,
                  "batch.kubernetes.io/job-name": name}
        problems += _labels(labels, "spec.template.metadata.labels")
        pod = template.get("spec") or {}
        for field_name in ("subdomain", "hostname"):
            if field_name in pod and (problem := _broken(pod[field_name], _DNS1123_LABEL)):
                problems.append(f"spec.template.spec.{field_name}: Invalid value: {pod[field_name]!r}: {problem}")
        if spec.get("completionMode") == "Indexed" and int(spec.get("completions") or 0) > 0:
            last = f"{name}-{int(spec['completions']) - 1}"
            if _broken(last, _DNS1123_LABEL):
                problems.append(f"metadata.name: Invalid value: {name!r}: will not able to create pod with invalid "
                                f"DNS label: {last}")
    return problems
