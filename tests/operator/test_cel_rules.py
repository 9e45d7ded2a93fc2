"""Every CEL rule of the CRD has a Python twin that refuses the same spec with the same message.

The operator's parse must catch what the API server would have refused, for objects that never
passed its check (a CRD older than the operator, CEL not enforced, an object stored before the
rule): the job then says which field is wrong instead of being reconciled from a bad spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from rtj_operator.api import crdgen, names
from rtj_operator.api.api_types import parse_job
from rtj_operator.api.spec_types import REJECTED_TEMPLATE_METADATA, RULES

from .fakes import job_body


def _schema_rules(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, str]]]:
    for rule in node.get("x-kubernetes-validations") or []:
        yield path, rule
    for name, sub in (node.get("properties") or {}).items():
        yield from _schema_rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _schema_rules(node[key], f"{path}[]")


def _generated() -> list[tuple[str, dict[str, str]]]:
    root = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return list(_schema_rules(root))


def _spec(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda body: body["spec"].update(changes)


def _name(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda body: body["metadata"].update(name=name)


def _template_metadata(field: str) -> Callable[[dict[str, Any]], None]:
    return lambda body: body["spec"]["template"].update(metadata={field: "x"})


def _exit_rules(*rules: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return _spec(resumePolicy={"exitCodeRules": list(rules)})


def _survivors_without_command(body: dict[str, Any]) -> None:
    body["spec"]["recovery"] = {"survivors": "Stay"}
    body["spec"]["template"]["spec"]["containers"][0].pop("command", None)


def _switch_without_elastic(body: dict[str, Any]) -> None:
    body["spec"]["recovery"] = {"survivors": "Stay", "inProcessSwitch": True}
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "train.py"]


VIOLATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "survivors stay without a command": _survivors_without_command,
    "spares without survivors staying": _spec(recovery={"spares": 1}),
    "in-process switch without an elastic gang or spares": _switch_without_elastic,
    "name too long": _name("a" * (names.MAX_JOB_NAME_LENGTH + 1)),
    "name not a DNS-1035 label": _name("1-train"),
    "unknown container": _spec(containerName="nope"),
    "minReplicas above replicas": _spec(elastic={"minReplicas": 3}),
    "backoff base above the default cap": _spec(resumePolicy={"backoffBaseSeconds": 700}),
    "volume at a URI": _spec(
        checkpoint={"dir": "s3://bucket/ck", "volumeSource": {"emptyDir": {}}}
    ),
    "relative dir": _spec(checkpoint={"dir": "relative/path"}),
    "invalid bucket": _spec(checkpoint={"dir": "s3://My_Bucket/run"}),
    "query string": _spec(checkpoint={"dir": "s3://bucket/run?x=1"}),
    "dot segment": _spec(checkpoint={"dir": "/mnt/../ck"}),
    "root dir": _spec(checkpoint={"dir": "/"}),
    "taint key prefix too long": _spec(
        preemptionSignals={"terminationTaints": [{"key": "p" * 254 + "/name"}]}
    ),
    **{f"template.metadata.{f}": _template_metadata(f) for f in REJECTED_TEMPLATE_METADATA},
    "exit code 0": _exit_rules({"exitCodes": [0], "action": "Retry"}),
    "exit code 256": _exit_rules({"exitCodes": [75, 256], "action": "Retry"}),
    "exit code rule matching nothing": _exit_rules({"action": "FailJob"}),
}
"""One spec per rule that breaks that rule alone."""


def _messages(change: Callable[[dict[str, Any]], None]) -> list[str]:
    body = job_body()
    change(body)
    with pytest.raises(ValidationError) as caught:
        parse_job(body)
    return [e["msg"].removeprefix("Value error, ") for e in caught.value.errors()]


def test_the_crd_has_exactly_the_rules_of_the_registry():
    generated = {(r["rule"], r["message"], r.get("fieldPath")) for _, r in _generated()}
    registered = {(r.rule, r.message, r.field_path) for r in RULES}
    assert generated == registered


def test_only_transition_rules_have_no_python_check():
    for rule in RULES:
        assert (rule.holds is None) == ("oldSelf" in rule.rule), rule.rule


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_each_violation_breaks_one_rule_with_its_own_message(case):
    messages = _messages(VIOLATIONS[case])
    assert len(messages) == 1, messages
    assert messages[0] in {r.message for r in RULES}


def test_every_checkable_rule_of_the_crd_is_caught_by_the_parse_with_its_message():
    caught = {m for change in VIOLATIONS.values() for m in _messages(change)}
    for path, rule in _generated():
        if "oldSelf" in rule["rule"]:
            continue
        assert rule["message"] in caught, f"{path or '<root>'}: {rule['rule']}"


def test_specs_that_keep_the_rules_parse():
    for body in (
        job_body(containerName="trainer", elastic={"minReplicas": 2}),
        job_body(
            recovery={"survivors": "Stay"},
            template={
                "spec": {"containers": [{"name": "t", "image": "i", "command": ["python", "t.py"]}]}
            },
        ),
        job_body(resumePolicy={"backoffBaseSeconds": 600}),
        job_body(  # a fixed-size gang switches to warm spares at a notice
            recovery={"survivors": "Stay", "spares": 1, "inProcessSwitch": True},
            template={
                "spec": {"containers": [{"name": "t", "image": "i", "command": ["python", "t.py"]}]}
            },
        ),
        job_body(checkpoint={"dir": "/mnt/ck", "volumeSource": {"emptyDir": {}}}),
        job_body(name="a" * names.MAX_JOB_NAME_LENGTH),
        job_body(
            resumePolicy={
                "exitCodeRules": [
                    {"exitCodes": [1, 255], "action": "Retry"},
                    {"reasons": ["OOMKilled"], "action": "Count"},
                    {"exitCodes": [137], "reasons": ["Error"], "action": "FailJob"},
                ]
            }
        ),
    ):
        parse_job(body)


def test_the_python_checks_read_dollar_as_re2_does():
    """RE2 (CEL's ``matches``) reads ``$`` as the end of the text; Python's ``re`` also
    matches it before a final newline, so ``"/\\n"`` passed as the root folder ``^/+$``."""
    from rtj_operator.api.spec_types import DOT_SEGMENT, ROOT_DIR, _matches

    assert _matches(ROOT_DIR, "/") and not _matches(ROOT_DIR, "/\n")
    assert _matches(DOT_SEGMENT, "a/..") and not _matches(DOT_SEGMENT, "a/..\n")
    assert _matches(DOT_SEGMENT, "a/../b")
