"""spec.resumePolicy.exitCodeRules: what a failure does, by the training container's exit."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from rtj_operator.act import metrics
from rtj_operator.act.controller import Controller
from rtj_operator.api.api_types import parse_job
from rtj_operator.api.spec_types import ExitCodeAction, ExitCodeRule
from rtj_operator.api.status_types import Cause
from rtj_operator.api.timeutil import iso
from rtj_operator.decide.classify import Outcome, RankOutcome
from rtj_operator.decide.exit_policy import decide
from rtj_operator.decide.invalid_spec import describe

from .fake_api import FakeApi
from .fakes import FakeCluster, job_body, make_node

RETRY_75 = {"exitCodes": [75], "action": "Retry"}
FAIL_ON_USAGE = {"exitCodes": [2], "action": "FailJob"}
RETRY_OOM = {"reasons": ["OOMKilled"], "action": "Retry"}


def running(*rules: dict[str, Any], **policy: Any) -> FakeCluster:
    """A running two-rank job with these rules; no backoff unless ``policy`` sets one."""
    cluster = FakeCluster.start(
        replicas=2,
        resumePolicy={"exitCodeRules": list(rules), "backoffBaseSeconds": 0, **policy},
    )
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["phase"] == "Running"
    return cluster


def rerun(cluster: FakeCluster, wait: float = 0.0) -> None:
    """Past the backoff, the next gang is created and runs."""
    cluster.step(wait)
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["phase"] == "Running", cluster.status["conditions"]


def events(plan) -> dict[str, str]:
    return {e.reason: e.message for e in plan.events}


def failed_condition(cluster: FakeCluster) -> dict[str, Any]:
    return {c["type"]: c for c in cluster.status["conditions"]}["Failed"]


def test_a_retry_code_restarts_without_touching_failures_and_counts_retries():
    cluster = running(RETRY_75, backoffBaseSeconds=10)
    cluster.terminate(1, 75)
    plan = cluster.step(1)
    st = cluster.status
    assert (st["retries"], st["failures"], st["attempt"]) == (1, 0, 1)
    assert st["phase"] == "Restarting" and plan.requeue_after == 10  # the failures' backoff
    last = st["interruptions"][-1]
    assert (last["cause"], last["preemption"], last["exitCode"]) == (Cause.FAILURE, False, 75)
    assert (last["action"], last["exitCodeRule"]) == ("Retry", 0)
    said = events(plan)
    assert "RankFailed" not in said
    assert said["RetryableExit"] == (
        "attempt 0: rank 1 (pod train-a0-r1 on node node-1): exit code 75 (Error) matches "
        "spec.resumePolicy.exitCodeRules[0] (Retry); retry 1 (maxRetries=10)"
    )
    assert said["BackingOff"] == "attempt 1 starts in 10s (retry 1)"
    assert "train-a0-r0" in {d.name for d in plan.deletions}  # the surviving rank is stopped
    restarting = {c["type"]: c for c in st["conditions"]}["Restarting"]
    assert restarting["reason"] == "Retrying"
    assert plan.interruption is not None and plan.interruption.action is ExitCodeAction.RETRY

    plan = cluster.step(10)
    assert plan.resubmission == "retry" and len(plan.creations) == 2  # the metrics' label
    cluster.schedule_and_run()
    cluster.step()
    cluster.terminate(0, 75)
    plan = cluster.step(1)
    assert (cluster.status["retries"], cluster.status["failures"]) == (2, 0)
    assert plan.requeue_after == 20  # doubled by the retry count


def test_past_max_retries_the_job_fails_with_its_own_reason():
    cluster = running(RETRY_75, maxRetries=1, backoffLimit=0)
    cluster.terminate(0, 75)
    cluster.step(1)
    rerun(cluster)
    cluster.terminate(1, 75)
    plan = cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Failed" and (st["retries"], st["failures"]) == (2, 0)
    failed = failed_condition(cluster)
    assert failed["reason"] == "RetryLimitExceeded"
    assert failed["message"].startswith("2 retries exceed maxRetries=1; last: rank 1 ")
    assert "exit code 75" in failed["message"] and "exitCodeRules[0]" in failed["message"]
    assert not plan.creations and "JobFailed" in events(plan)


def test_fail_job_fails_at_once_naming_rank_code_and_rule():
    cluster = running(RETRY_75, FAIL_ON_USAGE, backoffLimit=6)
    cluster.terminate(1, 2)
    plan = cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Failed" and st["failures"] == 1 and st["attempt"] == 0
    failed = failed_condition(cluster)
    assert failed["reason"] == "ExitCodeFailJob"
    assert failed["message"] == (
        "rank 1 (pod train-a0-r1 on node node-1): exit code 2 (Error) matches "
        "spec.resumePolicy.exitCodeRules[1] (FailJob)"
    )
    assert {"FatalExit", "JobFailed"} <= set(events(plan)) and "BackingOff" not in events(plan)
    assert (st["interruptions"][-1]["action"], st["interruptions"][-1]["exitCodeRule"]) == (
        "FailJob",
        1,
    )
    assert not plan.creations and "train-a0-r0" in {d.name for d in plan.deletions}


def test_a_code_no_rule_matches_counts_as_a_failure():
    cluster = running(RETRY_75, FAIL_ON_USAGE, backoffLimit=0)
    cluster.terminate(0, 1)
    plan = cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Failed" and (st["failures"], st.get("retries", 0)) == (1, 0)
    assert failed_condition(cluster)["reason"] == "BackoffLimitExceeded"
    last = st["interruptions"][-1]
    assert last["action"] == "Count" and "exitCodeRule" not in last
    assert "RankFailed" in events(plan) and "matches" not in events(plan)["RankFailed"]


def test_a_count_rule_counts_and_names_itself():
    cluster = running({"exitCodes": [1], "action": "Count"}, RETRY_75)
    cluster.terminate(0, 1)
    plan = cluster.step(1)
    assert (cluster.status["failures"], cluster.status.get("retries", 0)) == (1, 0)
    assert cluster.status["interruptions"][-1]["exitCodeRule"] == 0
    assert events(plan)["RankFailed"].endswith(
        "(matches spec.resumePolicy.exitCodeRules[0] (Count))"
    )


def test_a_reason_rule_matches_oom_killed():
    cluster = running(RETRY_OOM)
    cluster.terminate(0, 137, "OOMKilled")
    plan = cluster.step(1)
    assert (cluster.status["retries"], cluster.status["failures"]) == (1, 0)
    assert "exit code 137 (OOMKilled)" in events(plan)["RetryableExit"]


def test_the_first_matching_rule_wins_and_codes_and_reasons_must_both_match():
    rules = [
        ExitCodeRule.model_validate(
            {"exitCodes": [137], "reasons": ["OOMKilled"], "action": "Retry"}
        ),
        ExitCodeRule.model_validate({"exitCodes": [137, 2], "action": "FailJob"}),
        ExitCodeRule.model_validate({"reasons": ["Error"], "action": "Retry"}),
    ]

    def failed(code: int, reason: str) -> RankOutcome:
        return RankOutcome(0, Outcome.FAILED, exit_code=code, exit_reason=reason, own_exit=True)

    assert decide(rules, failed(137, "OOMKilled")).rule == 0
    assert decide(rules, failed(137, "Error")).rule == 1  # SIGKILL, not the OOM killer
    assert decide(rules, failed(2, "Error")).rule == 1
    assert decide(rules, failed(3, "Error")).rule == 2
    assert decide(rules, failed(3, "ContainerCannotRun")).rule is None
    assert decide(rules, failed(3, "ContainerCannotRun")).action is ExitCodeAction.COUNT


def test_a_preemption_with_a_listed_code_is_still_a_preemption():
    cluster = running(FAIL_ON_USAGE, RETRY_75, backoffLimit=0, maxRetries=0)
    cluster.pod(0)["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    cluster.terminate(0, 2)
    cluster.step(1)
    st = cluster.status
    assert st["preemptions"] == 1 and st["phase"] == "Restarting"
    assert (st["failures"], st.get("retries", 0)) == (0, 0)
    assert "action" not in st["interruptions"][-1]

    # A listed code while the rank's node is announced for termination: a preemption too.
    rerun(cluster)
    cluster.nodes["node-1"]["spec"]["taints"] = [{"key": "karpenter.sh/disrupted"}]
    cluster.terminate(1, 75)
    cluster.step(1)
    st = cluster.status
    assert st["preemptions"] == 2 and (st["failures"], st.get("retries", 0)) == (0, 0)
    assert st["interruptions"][-1]["cause"] == Cause.TERMINATION_NOTICE


def test_a_retry_does_not_count_towards_quarantine():
    cluster = running(RETRY_75, quarantineThreshold=2, backoffLimit=10)
    cluster.report(0, "ep0-ba100", 100)
    cluster.step()
    cluster.nodes.pop("node-0")
    cluster.step(1)  # preempted: the next attempt resumes from ep0-ba100
    for _ in range(3):
        rerun(cluster)
        cluster.terminate(0, 75)  # crashes soon after resuming, no new commit
        cluster.step(1)
    st = cluster.status
    assert st["retries"] == 3 and not st.get("quarantinedCheckpoints")
    assert "resumeFailures" not in st and st["resumeCheckpoint"] == "ep0-ba100"
    rerun(cluster)
    cluster.terminate(0, 1)  # a counted failure still does
    cluster.step(1)
    assert cluster.status["resumeFailures"] == {"checkpoint": "ep0-ba100", "count": 1}


def test_the_rank_that_ended_first_decides_for_the_gang():
    """Rank 1 hits the transient error; rank 0 crashes a second later with its NCCL timeout
    (exit 1, no rule): the gang is retried, described by rank 1."""
    cluster = running(RETRY_75, backoffLimit=0)
    cluster.terminate(0, 1)
    cluster.terminate(1, 75)
    for rank, after in ((0, 31), (1, 30)):
        ended = cluster.pod(rank)["status"]["containerStatuses"][0]["state"]["terminated"]
        ended["finishedAt"] = iso(cluster.now + timedelta(seconds=after))
    cluster.step(40)
    st = cluster.status
    assert st["interruptions"][-1]["rank"] == 1
    assert (st["retries"], st["failures"], st["phase"]) == (1, 0, "Restarting")


def test_a_pod_the_kubelet_failed_itself_is_counted_whatever_its_code():
    """Past its own activeDeadlineSeconds the kubelet kills the container: the code is the
    kill's (137), not the program's, so a rule on 137 does not make it retried for ever."""
    cluster = running({"exitCodes": [137], "action": "Retry"}, backoffLimit=5)
    cluster.terminate(0, 137)
    cluster.pod(0)["status"]["reason"] = "DeadlineExceeded"
    cluster.step(1)
    st = cluster.status
    assert (st["failures"], st.get("retries", 0)) == (1, 0)
    assert st["interruptions"][-1]["action"] == "Count"


def _parse_error(*rules: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_job(job_body(resumePolicy={"exitCodeRules": list(rules)}))
    return describe(caught.value)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            {"exitCodes": [0], "action": "Retry"},
            "spec.resumePolicy.exitCodeRules[0].exitCodes: resumePolicy.exitCodeRules[].exitCodes "
            "must hold exit codes from 1 to 255: 0 is a success",
        ),
        (
            {"exitCodes": [1, 256], "action": "Retry"},
            "spec.resumePolicy.exitCodeRules[0].exitCodes: resumePolicy.exitCodeRules[].exitCodes "
            "must hold exit codes from 1 to 255",
        ),
        (
            {"action": "Retry"},
            "spec.resumePolicy.exitCodeRules[0]: resumePolicy.exitCodeRules[] must list "
            "exitCodes, reasons or both",
        ),
        (
            {"exitCodes": [], "action": "Retry"},
            "spec.resumePolicy.exitCodeRules[0].exitCodes: List should have at least 1 item",
        ),
        (
            {"exitCodes": [75], "action": "Restart"},
            "spec.resumePolicy.exitCodeRules[0].action: Input should be 'Retry', 'FailJob' or "
            "'Count'",
        ),
        (
            {"exitCodes": [75]},
            "spec.resumePolicy.exitCodeRules[0].action: Field required",
        ),
    ],
)
def test_bad_rules_are_refused_naming_the_field_and_what_it_expects(rule, expected):
    assert expected in _parse_error(rule)


def test_at_most_twenty_rules():
    assert "List should have at most 20 items" in _parse_error(*[RETRY_75] * 21)
    parse_job(job_body(resumePolicy={"exitCodeRules": [RETRY_75] * 20}))


def test_the_crd_bounds_and_checks_the_rules():
    from rtj_operator.api import crdgen

    root = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    policy = root["properties"]["spec"]["properties"]["resumePolicy"]
    rules = policy["properties"]["exitCodeRules"]
    assert rules["maxItems"] == 20 and rules["default"] == []
    item = rules["items"]
    assert item["required"] == ["action"]
    assert item["properties"]["action"]["enum"] == ["Retry", "FailJob", "Count"]
    assert [r["rule"] for r in item["x-kubernetes-validations"]] == [
        "has(self.exitCodes) || has(self.reasons)"
    ]
    codes = item["properties"]["exitCodes"]
    assert codes["minItems"] == 1 and codes["maxItems"] == 255
    assert [r["rule"] for r in codes["x-kubernetes-validations"]] == [
        "self.all(code, code >= 1 && code <= 255)"
    ]
    assert policy["properties"]["maxRetries"]["default"] == 10
    assert policy["default"]["maxRetries"] == 10


def test_an_invalid_rule_surfaces_as_invalid_spec_on_the_job():
    """Past a CRD without the rules: Blocked=True, reason InvalidSpec, naming the field."""
    api = FakeApi()
    api.put_job(
        job_body(
            replicas=2, resumePolicy={"exitCodeRules": [{"exitCodes": [0], "action": "Retry"}]}
        )
    )
    api.nodes["node-0"] = make_node("node-0")
    ctrl = Controller(api, resync_seconds=0)  # type: ignore[arg-type]

    async def sync() -> None:
        await ctrl.sync(("ns", "train"), time.monotonic())
        await asyncio.gather(*ctrl.executor.events.tasks)

    asyncio.run(sync())
    blocked = next(c for c in api.job()["status"]["conditions"] if c["type"] == "Blocked")
    assert (blocked["status"], blocked["reason"]) == ("True", "InvalidSpec")
    assert "spec.resumePolicy.exitCodeRules[0].exitCodes: " in blocked["message"]
    assert "from 1 to 255" in blocked["message"]
    assert not api.pods()


def test_a_retry_is_its_own_kind_in_the_interruption_metric():
    api = FakeApi()
    api.put_job(job_body(replicas=2, resumePolicy={"exitCodeRules": [RETRY_75]}))
    for node in ("node-0", "node-1"):
        api.nodes[node] = make_node(node)
    ctrl = Controller(api, resync_seconds=0)  # type: ignore[arg-type]

    def retries() -> float:
        labels = {"cause": "Failure", "kind": "retry"}
        return metrics.REGISTRY.get_sample_value("rtj_interruptions_total", labels) or 0

    async def sync() -> None:
        await ctrl.sync(("ns", "train"), time.monotonic())
        await asyncio.gather(*ctrl.executor.events.tasks)

    asyncio.run(sync())
    api.run_pods("node-0")
    asyncio.run(sync())
    before = retries()
    pod = api.pods()["train-a0-r1"]
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"terminated": {"exitCode": 75, "reason": "Error"}}}
    ]
    asyncio.run(sync())
    assert api.job()["status"]["retries"] == 1
    assert retries() == before + 1
