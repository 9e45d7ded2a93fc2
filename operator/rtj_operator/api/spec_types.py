"""The ResumableTrainingJob spec: the pydantic models the CRD schema is generated from.

These models are the single source of truth: ``crdgen`` turns them into the CRD's OpenAPI schema
(attribute docstrings become field descriptions, defaults become API-server defaults, and the
``x-kubernetes-validations`` extras become CEL rules), and the operator parses every object with
them. Validation that the API server can do lives here so invalid manifests are rejected at
``kubectl apply`` time with the field's name, instead of surfacing later as an operator error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from . import names


def cel(
    rule: str, message: str, field_path: str | None = None, message_expression: str | None = None
) -> dict[str, str]:
    """One CEL validation rule in the CRD's ``x-kubernetes-validations`` shape.

    ``message_expression`` (CEL producing the message, with the offending values) wins over
    ``message`` on the API server; ``message`` stays as the reference page's text and fallback.
    """
    out = {"rule": rule, "message": message}
    if message_expression:
        out["messageExpression"] = message_expression
    if field_path:
        out["fieldPath"] = field_path
    return out


@dataclass(frozen=True)
class Rule:
    """One CEL rule of the CRD beside its Python twin: one record, one message for both.

    The API server enforces ``rule``; the operator's parse enforces ``holds`` on the same value
    (the rule's ``self``: the validated model, or the field's value), for objects that never
    passed the API server's check: a CRD older than the operator, an API server that does not
    enforce CEL, an object stored before the rule existed. ``holds`` is None only for a
    transition rule (``oldSelf``): it compares with the previous object, which one parse does
    not have, so only the API server can check it.
    """

    rule: str
    message: str
    holds: Callable[[Any], bool] | None
    field_path: str | None = None

    def schema(self) -> dict[str, str]:
        """The rule in the CRD's ``x-kubernetes-validations`` shape."""
        return cel(self.rule, self.message, self.field_path)


def validations(rules: Iterable[Rule]) -> dict[str, Any]:
    """The ``json_schema_extra`` that puts ``rules`` into the CRD."""
    return {"x-kubernetes-validations": [r.schema() for r in rules]}


def enforce(rules: Iterable[Rule], value: Any) -> None:
    """Raise the message of the first rule ``value`` breaks (for a pydantic validator)."""
    for rule in rules:
        if rule.holds is not None and not rule.holds(value):
            raise ValueError(rule.message)


def immutable(field: str) -> Rule:
    """A field that keeps its value once created (a transition rule: the API server's alone)."""
    return Rule("self == oldSelf", f"{field} is immutable", None)


DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1123 label: what Kubernetes accepts as a container name."""
DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1035 label: what Kubernetes accepts as a Service name."""

MAX_GRACE_PERIOD_SECONDS = 86400
"""Upper bound of terminationGracePeriodSeconds: a day is far beyond any spot notice."""


class ApiModel(BaseModel):
    """Base for the API types, spec and status alike: camelCase on the wire, attribute docstrings
    as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )


TAINT_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A Kubernetes taint key (a qualified name): an optional DNS-1123 subdomain prefix and '/', then
a name of at most 63 characters."""
TAINT_KEY_PREFIX_TOO_LONG = r"^[^/]{254,}/"
"""A prefix over the 253 characters of a DNS subdomain (the pattern cannot count it)."""
TAINT_KEY_FORM = (
    "must be a taint key: an optional DNS subdomain prefix (lowercase letters, digits, '-' and "
    "'.', at most 253 characters) and '/', then a name of at most 63 characters of letters, "
    "digits, '-', '_' and '.' that starts and ends with a letter or digit (for example "
    "karpenter.sh/disrupted)"
)


TAINT_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A Kubernetes taint value (a label value, at most 63 characters by the field's length)."""


TAINT_KEY_RULES = (
    Rule(
        f"!self.matches('{TAINT_KEY_PREFIX_TOO_LONG}')",
        f"preemptionSignals.terminationTaints[].key {TAINT_KEY_FORM}",
        lambda key: not re.search(TAINT_KEY_PREFIX_TOO_LONG, key),
    ),
)


class TaintSelector(ApiModel):
    """A node taint that announces the node is about to go away."""

    key: str = Field(
        min_length=1,
        max_length=317,
        json_schema_extra={"pattern": TAINT_KEY, **validations(TAINT_KEY_RULES)},
    )
    """Taint key to match, as Kubernetes spells taint keys: an optional DNS subdomain prefix (at
    most 253 characters) and '/', then a name of at most 63 characters of letters, digits, '-',
    '_' and '.' that starts and ends with a letter or digit."""
    value: str | None = Field(default=None, max_length=63, pattern=TAINT_VALUE)
    """Taint value to match, as Kubernetes spells taint values (a label value: at most 63
    characters of letters, digits, '-', '_' and '.' that start and end with a letter or digit,
    or empty); any value when omitted."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; any effect when omitted."""

    @field_validator("key")
    @classmethod
    def _taint_key(cls, key: str) -> str:
        """The CRD's pattern and prefix rule, for objects that did not pass the API server's."""
        if not re.search(TAINT_KEY, key):
            raise ValueError(f"preemptionSignals.terminationTaints[].key {key!r} {TAINT_KEY_FORM}")
        enforce(TAINT_KEY_RULES, key)
        return key


DEFAULT_TERMINATION_TAINTS: tuple[TaintSelector, ...] = (
    # GKE (k8s-node-termination-handler) before a Spot/preemptible VM is reclaimed.
    TaintSelector(key="cloud.google.com/impending-node-termination"),
    # AWS node termination handler: spot interruption, rebalance, ASG and maintenance events.
    TaintSelector(key="aws-node-termination-handler/spot-itn"),
    TaintSelector(key="aws-node-termination-handler/rebalance-recommendation"),
    TaintSelector(key="aws-node-termination-handler/asg-lifecycle-termination"),
    TaintSelector(key="aws-node-termination-handler/scheduled-maintenance"),
    # Karpenter disrupting (consolidating or interrupting) a node.
    TaintSelector(key="karpenter.sh/disrupted"),
    # AKS node auto-drain on a Preempt/Terminate scheduled event (both spellings seen in the wild).
    TaintSelector(key="remediator.kubernetes.azure.com/unschedulable"),
    TaintSelector(key="remediator.aks.microsoft.com/unschedulable"),
    # cluster-autoscaler about to remove the node in a scale-down.
    TaintSelector(key="ToBeDeletedByClusterAutoscaler"),
    # The cloud node-lifecycle controller saw the instance shut down.
    TaintSelector(key="node.cloudprovider.kubernetes.io/shutdown"),
    # An administrator declared the node out of service (non-graceful node shutdown).
    TaintSelector(key="node.kubernetes.io/out-of-service"),
)


class PreemptionSignals(ApiModel):
    """Which node signals mean "this node is going away" (docs/operator.md, Classification)."""

    termination_taints: list[TaintSelector] = Field(
        default_factory=lambda: list(DEFAULT_TERMINATION_TAINTS), max_length=64
    )
    """Taints that announce a node's termination. When one lands on a node that runs a rank, the
    operator writes the preemption notice into that rank's pod so the runtime checkpoints at
    once; the gang is restarted only when the pod actually goes. Setting this list replaces the
    defaults (GKE, AWS node termination handler, Karpenter, AKS, cluster-autoscaler scale-down,
    cloud shutdown and ``node.kubernetes.io/out-of-service``)."""
    node_not_ready_seconds: int = Field(default=60, ge=0, le=86400)
    """How long a rank's node may stay NotReady (or Unknown) before the rank counts as lost to a
    preemption and the gang is resubmitted. Default 60. A kept worker whose collective failed
    when such a peer went waits for its new membership this long plus 80 s (the node
    controller's 50 s grace and 30 s) and ``elastic.shrinkAfterSeconds``
    (``RTJ_LOSS_HOLD_SECONDS``)."""
    failure_settle_seconds: int = Field(default=0, ge=0, le=3600)
    """When a rank fails while other ranks' pods still run, how long after its exit the
    operator waits before counting a failure. A node that dies without its Node being deleted
    (a kernel panic, a lost network) turns NotReady only after the node controller's grace
    period (40-50 s), while the ranks on healthy nodes crash at once when their peer goes:
    with a wait longer than that grace (90 is a good value), a still-running rank whose node
    turns NotReady, is deleted or announced meanwhile makes it a preemption instead of a
    failure. The wait ends at once when no other rank runs any more (they crashed too, as
    after a bug); the price is that a real failure whose other ranks hang is counted that much
    later. Default 0: a failure counts at once, unless every failed rank's worker reported a
    failed collective on its pod (``resumable.dev/peer-lost``): that failure waits without this
    setting while the operator checks the gang's nodes' Leases, at most three quarters of a
    Lease's duration (docs/operator.md, "Classification")."""


class ExitCodeAction(StrEnum):
    """What a failure matched by an exit code rule does to the job."""

    RETRY = "Retry"
    """A transient error: resubmit the gang as after a failure, with the same backoff, but
    counted against ``maxRetries`` (``status.retries``), not ``backoffLimit``; it never counts
    towards quarantine."""
    FAIL_JOB = "FailJob"
    """An error no retry can fix: the job fails at once (reason ExitCodeFailJob)."""
    COUNT = "Count"
    """A failure like any other: ``backoffLimit``, backoff, quarantine (what an exit no rule
    matches does)."""


MAX_EXIT_CODE_RULES = 20
"""Bound of ``resumePolicy.exitCodeRules``."""

EXIT_CODES_RULES = (
    Rule(
        "self.all(code, code >= 1 && code <= 255)",
        "resumePolicy.exitCodeRules[].exitCodes must hold exit codes from 1 to 255: 0 is a "
        "success, never a failure, and a container's exit code is at most 255 (128+N when "
        "signal N killed it, such as 137 for SIGKILL)",
        lambda codes: all(1 <= code <= 255 for code in codes),
    ),
)
"""Their ``self`` is the rule's ``exitCodes`` list."""

EXIT_CODE_RULE_RULES = (
    Rule(
        "has(self.exitCodes) || has(self.reasons)",
        "resumePolicy.exitCodeRules[] must list exitCodes, reasons or both: what the rule "
        "matches, such as exitCodes: [75] or reasons: [OOMKilled]",
        lambda rule: rule.exit_codes is not None or rule.reasons is not None,
    ),
)
"""Their ``self`` is one rule (``ExitCodeRule``)."""


class ExitCodeRule(ApiModel):
    """One rule of ``resumePolicy.exitCodeRules``: which failures it matches and what they do."""

    model_config = ConfigDict(json_schema_extra=validations(EXIT_CODE_RULE_RULES))

    exit_codes: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        json_schema_extra=validations(EXIT_CODES_RULES),
    )
    """Exit codes of the training container (``containerName``) that match, from 1 to 255.
    When ``reasons`` is set too, both must match."""
    reasons: list[Annotated[str, Field(min_length=1, max_length=128)]] | None = Field(
        default=None, min_length=1, max_length=16
    )
    """Termination reasons of the training container, as the kubelet reports them in its
    ``state.terminated.reason`` (exact spelling: ``OOMKilled``, ``Error``,
    ``ContainerCannotRun``, ``StartError``), that match. When ``exitCodes`` is set too, both
    must match."""
    action: ExitCodeAction
    """Retry (a transient error: restart against ``maxRetries``, not ``backoffLimit``), FailJob
    (fail the job at once) or Count (a failure against ``backoffLimit``, as when no rule
    matches)."""

    @field_validator("exit_codes")
    @classmethod
    def _exit_codes(cls, codes: list[int] | None) -> list[int] | None:
        if codes is not None:
            enforce(EXIT_CODES_RULES, codes)
        return codes

    @model_validator(mode="after")
    def _rules(self) -> ExitCodeRule:
        enforce(EXIT_CODE_RULE_RULES, self)
        return self

    def matches(self, exit_code: int | None, reason: str | None) -> bool:
        """Whether a failure with this exit code and termination reason matches: every
        criterion the rule sets must hold."""
        if self.exit_codes is not None and exit_code not in self.exit_codes:
            return False
        return self.reasons is None or reason in self.reasons


RESUME_POLICY_RULES = (
    Rule(
        "self.backoffBaseSeconds <= self.backoffMaxSeconds",
        "backoffBaseSeconds must not exceed backoffMaxSeconds (600 when not set): "
        "lower backoffBaseSeconds or raise backoffMaxSeconds",
        lambda policy: policy.backoff_base_seconds <= policy.backoff_max_seconds,
        ".backoffBaseSeconds",
    ),
)


class ResumePolicy(ApiModel):
    """How interruptions are counted and when the next attempt starts."""

    model_config = ConfigDict(json_schema_extra=validations(RESUME_POLICY_RULES))

    max_preemptions: int | None = Field(default=None, ge=0)
    """How many preemptions the job survives; past it the job is Failed with reason
    PreemptionLimitExceeded. Unlimited when omitted (the default): preemptions are the normal
    life of a spot job and never touch the failure budget."""
    backoff_limit: int = Field(default=6, ge=0, le=1000)
    """How many real failures (non-zero exits without a disruption signal, OOMKilled included)
    are retried; the next one fails the job with reason BackoffLimitExceeded. Default 6."""
    backoff_base_seconds: int = Field(default=10, ge=0, le=86400)
    """Delay before the attempt that follows the first failure; it doubles with each further
    failure. Preemptions restart immediately. Default 10."""
    backoff_max_seconds: int = Field(default=600, ge=0, le=86400)
    """Cap on the failure backoff delay. Default 600."""
    quarantine_threshold: int = Field(default=2, ge=0, le=100)
    """Consecutive failures right after resuming from the same checkpoint (no newer checkpoint
    committed in between) that quarantine it: the next attempt resumes from the checkpoint
    before it and the runtime is told to skip it. 0 disables quarantine. Default 2."""
    quarantine_window_seconds: int = Field(default=900, ge=0, le=604800)
    """A failure counts towards quarantine only when it happens within this many seconds of the
    attempt's start, so a late crash never blames a good checkpoint. Default 900."""
    max_retries: int = Field(default=10, ge=0, le=10000)
    """How many failures that an ``exitCodeRules`` rule with action Retry matches are retried
    (``status.retries``); the next one fails the job with reason RetryLimitExceeded. They never
    touch ``backoffLimit``. Default 10."""
    exit_code_rules: list[ExitCodeRule] = Field(
        default_factory=list, max_length=MAX_EXIT_CODE_RULES
    )
    """What a failure means by the training container's exit code or termination reason, in
    order: the first rule that matches decides (Retry, FailJob or Count); a failure no rule
    matches counts against ``backoffLimit``. They apply to failures only (a non-zero exit
    without any disruption signal): a preemption stays a preemption whatever the code. In a
    gang, the failed rank whose training container ended first decides. At most 20 rules.
    See docs/operator.md, Exit code rules."""

    @model_validator(mode="after")
    def _rules(self) -> ResumePolicy:
        enforce(RESUME_POLICY_RULES, self)
        return self


S3_URI = r"^s3://[^/]+(/.*)?$"
S3_BUCKET = r"^s3://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/|$)"
S3_DOUBLE_DOT = r"^s3://[^/]*[.][.]"
S3_IP_BUCKET = r"^s3://[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+(/|$)"
QUERY_OR_FRAGMENT = r"[?#]"
DOT_SEGMENT = r"(^|/)[.][.]?(/|$)"
ROOT_DIR = r"^/+$"


def _matches(pattern: str, text: str) -> bool:
    """CEL's ``matches``: an RE2 search anywhere in the string. RE2's ``$`` is the end of the
    text only; Python's also matches before a final newline, so it becomes ``\\Z``."""
    return re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), text) is not None


CHECKPOINT_RULES = (
    Rule(
        "!has(self.volumeSource) || self.dir.startsWith('/')",
        "a checkpoint volumeSource is mounted at dir, so dir must be an absolute path",
        lambda ck: ck.volume_source is None or ck.dir.startswith("/"),
        ".dir",
    ),
)
CHECKPOINT_DIR_RULES = (
    Rule(
        f"self.startsWith('/') || self.matches('{S3_URI}')",
        "checkpoint.dir must be an object-store URI such as s3://bucket/prefix or an "
        "absolute path such as /mnt/checkpoints (the runtime reads s3:// URIs only, "
        "for S3 and S3-compatible stores)",
        lambda d: d.startswith("/") or _matches(S3_URI, d),
    ),
    Rule(
        "!self.startsWith('s3://') || "
        f"(self.matches('{S3_BUCKET}') && "
        f"!self.matches('{S3_DOUBLE_DOT}') && "
        f"!self.matches('{S3_IP_BUCKET}'))",
        "checkpoint.dir must name a valid bucket, as the runtime requires: 3-63 "
        "lowercase letters, digits, '.', '-' or '_', starting and ending with a "
        "letter or digit, not an IP address, such as s3://my-bucket/checkpoints",
        lambda d: (
            not d.startswith("s3://")
            or (
                _matches(S3_BUCKET, d)
                and not _matches(S3_DOUBLE_DOT, d)
                and not _matches(S3_IP_BUCKET, d)
            )
        ),
    ),
    Rule(
        f"!self.startsWith('s3://') || !self.matches('{QUERY_OR_FRAGMENT}')",
        "checkpoint.dir must not contain ? or #: the runtime refuses query strings "
        "and fragments in s3:// URIs",
        lambda d: not d.startswith("s3://") or not _matches(QUERY_OR_FRAGMENT, d),
    ),
    Rule(
        f"!self.matches('{DOT_SEGMENT}')",
        "checkpoint.dir must not contain . or .. segments: give the folder itself, "
        "such as /mnt/checkpoints",
        lambda d: not _matches(DOT_SEGMENT, d),
    ),
    Rule(
        f"!self.matches('{ROOT_DIR}')",
        "checkpoint.dir must not be the root directory /: each run writes under "
        "<dir>/<runName>/ and needs a folder of its own, such as /mnt/checkpoints",
        lambda d: not _matches(ROOT_DIR, d),
    ),
)


class CheckpointLocation(ApiModel):
    """Where the runtime writes checkpoints (layout: docs/runtime.md)."""

    model_config = ConfigDict(json_schema_extra=validations(CHECKPOINT_RULES))

    dir: str = Field(
        min_length=1, max_length=1024, json_schema_extra=validations(CHECKPOINT_DIR_RULES)
    )
    """Checkpoint root: an object-store URI (``s3://bucket/prefix``) or an absolute path on a
    shared volume. Each run writes under ``<dir>/<runName>/``. Passed to every rank as
    RTJ_CHECKPOINT_DIR. Immutable."""
    volume_source: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            # Exactly one source, as in a pod's volume: an empty one mounted nothing, so the
            # checkpoints went to the container's own disk and were lost with it.
            "minProperties": 1,
            "maxProperties": 1,
        },
    )
    """Optional Kubernetes volume source, exactly one (for example ``persistentVolumeClaim:
    {claimName: ckpt}``), that the operator mounts at ``dir`` in the training container. Omit it
    when ``dir`` is an object-store URI or when the pod template mounts the volume itself."""

    @field_validator("dir")
    @classmethod
    def _dir_rules(cls, value: str) -> str:
        enforce(CHECKPOINT_DIR_RULES, value)
        return value

    @model_validator(mode="after")
    def _rules(self) -> CheckpointLocation:
        enforce(CHECKPOINT_RULES, self)
        return self


_POD_NAME = "the operator names each rank's pod <job>-a<attempt>-r<rank> (its hostname)"
_SERVER_SET = "the API server sets it on each pod"
REJECTED_TEMPLATE_METADATA: dict[str, str] = {
    "name": _POD_NAME,
    "generateName": _POD_NAME,
    "namespace": "the pods run in the job's namespace",
    "finalizers": "the operator deletes a rank's pod to end an attempt, and a finalizer would "
    "keep the pod, and its name, from going",
    "ownerReferences": "the job is the pods' owner (they are deleted with it)",
    "uid": _SERVER_SET,
    "resourceVersion": _SERVER_SET,
    "generation": _SERVER_SET,
    "creationTimestamp": _SERVER_SET,
    "deletionTimestamp": _SERVER_SET,
    "deletionGracePeriodSeconds": _SERVER_SET,
    "selfLink": _SERVER_SET,
    "managedFields": _SERVER_SET,
}
"""The ObjectMeta fields of ``template.metadata`` that the operator would not copy onto the pods,
and why. They are refused rather than dropped without a word: a user who writes a finalizer or a
namespace there expects it to apply."""


def _rejected_metadata_message(field: str) -> str:
    return (
        f"template.metadata.{field} is not allowed: {REJECTED_TEMPLATE_METADATA[field]}; "
        "only labels and annotations are copied onto the pods"
    )


TEMPLATE_METADATA_RULES = tuple(
    # A null is absent, as the API server prunes it.
    Rule(
        f"!has(self.{field})",
        _rejected_metadata_message(field),
        lambda meta, field=field: meta.get(field) is None,
        f".{field}",
    )
    for field in REJECTED_TEMPLATE_METADATA
)
"""Their ``self`` is ``template.metadata`` as written (a dict), not the model."""


class TemplateMetadata(ApiModel):
    """Labels and annotations copied onto every rank's pod. Every other metadata field (name,
    generateName, namespace, finalizers, ownerReferences and those the API server sets) is
    rejected: the operator sets them itself."""

    model_config = ConfigDict(json_schema_extra=validations(TEMPLATE_METADATA_RULES))

    labels: dict[str, str] | None = None
    """Extra pod labels. The operator's own ``resumable.dev/*`` labels win on conflict."""
    annotations: dict[str, str] | None = None
    """Extra pod annotations. ``resumable.dev/progress`` and ``resumable.dev/preemption-notice``
    are not copied: each pod's own are written by its runtime and by the operator."""

    @model_validator(mode="before")
    @classmethod
    def _only_labels_and_annotations(cls, data: Any) -> Any:
        """The CRD's rules, on the object as written: the model drops the fields they refuse."""
        if isinstance(data, dict):
            enforce(TEMPLATE_METADATA_RULES, data)
        return data


class ContainerTemplate(ApiModel):
    """A container of the pod template. Only the fields the operator relies on are modelled here;
    the CRD types every other field from the core Container schema (podschema.py)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """Container name: a DNS-1123 label (lowercase letters, digits and '-'), as for any pod."""
    image: str | None = None
    """Container image."""


class PodSpecTemplate(ApiModel):
    """The pod spec every rank runs: a core/v1 PodSpec, validated by the API server against the
    Kubernetes schema embedded in the CRD (unknown fields are rejected)."""

    model_config = ConfigDict(extra="allow")

    containers: list[ContainerTemplate] = Field(min_length=1, max_length=64)
    """The pod's containers; the training container is ``containerName`` (default: the first)."""
    restart_policy: Literal["Never"] | None = None
    """Always Never: a rank that ends is handled by the operator, which restarts the whole gang
    (distributed training cannot continue with one rank restarted alone)."""
    init_containers: list[ContainerTemplate] | None = Field(default=None, max_length=64)
    """Init containers (native sidecars included), run as the template says."""
    termination_grace_period_seconds: int | None = Field(
        default=None, ge=0, le=MAX_GRACE_PERIOD_SECONDS
    )
    """Time the training process gets between SIGTERM and SIGKILL to save (default 30, at most
    86400); also passed to the runtime as RTJ_GRACE_PERIOD_SECONDS."""
    service_account_name: str | None = None
    """When omitted the operator runs the ranks as ``<job>-trainer``, a ServiceAccount it creates
    that may patch only the current and the previous attempt's pods (the runtime's progress
    annotation). When set, the user grants that account ``get`` and ``patch`` on pods (see
    docs/operator.md)."""


class Survivors(StrEnum):
    """What happens to the healthy ranks' pods when a gang loses some of its pods."""

    REPLACE = "Replace"
    """Every rank's pod is replaced: the whole gang is resubmitted and cold-starts."""
    STAY = "Stay"
    """The healthy pods stay and are told the new membership; their in-pod agent restarts the
    workers in place, warm (docs/survivors.md). Only the lost places get new pods. The training
    container's ``command`` is run under ``python -m trainer_runtime.agent --``."""


class RecoveryPolicy(ApiModel):
    """How a gang recovers from a preemption of some of its pods."""

    survivors: Survivors = Survivors.REPLACE
    """``Replace`` (default) or ``Stay``. With ``Stay`` a preemption (node lost, evicted,
    disrupted) of some pods keeps every other pod that runs on a healthy node; it still counts
    as a preemption and starts a new attempt, whose lost places get new pods. A failure (a rank's
    own non-zero exit) always replaces the whole gang."""
    spares: int = Field(default=0, ge=0, le=64)
    """With ``survivors: Stay`` and a fixed-size gang: how many spare pods to keep started
    beside the gang (interpreter up, torch and the runtime imported, no worker), on nodes the
    gang does not need. A preemption gives a lost rank's place to a spare that is warm instead
    of a new pod that cold-starts, and a new spare is started when there is room. A spare that
    cannot be placed while a rank waits for a node is deleted: ranks come first. Default 0."""
    in_process_switch: bool = False
    """With ``survivors: Stay`` and ``elastic``: a grow switches the running workers to the new
    membership in process instead of restarting them (they save nothing, load nothing; the new
    ranks get the state from rank 0), and a termination notice makes the pods on the noticed
    node leave the gang at once while the others switch to the smaller gang (when at least
    ``minReplicas`` are kept). With ``survivors: Stay`` and ``spares`` (a fixed-size gang): at a
    notice, warm spares take the noticed pods' places by the same switch (when one is warm for
    each). The training script must be built for it
    (``CheckpointManager(..., in_process_switch=True)``, docs/survivors.md); a pod whose workers
    are not restarts them in place as without it. Default false."""


class PodTemplate(ApiModel):
    """Template of every rank's pod: a core/v1 PodTemplateSpec (every field is typed by the
    Kubernetes schema the CRD embeds, so a misspelt field is rejected at apply time)."""

    metadata: TemplateMetadata | None = None
    """Labels and annotations for the pods; no other metadata field is accepted."""
    spec: PodSpecTemplate
    """Pod spec for every rank."""


class GrowPolicy(ApiModel):
    """When a shrunk gang grows back towards ``replicas``."""

    enabled: bool = True
    """Grow back when capacity returns. Default true."""
    min_interval_seconds: int | None = Field(default=None, ge=0, le=604800)
    """At least this long between the running gang's first progress after its resume (its first
    step or commit, ``status.trainingSince``), or its last abandoned grow, and a grow, so a
    flapping node pool does not restart the gang over and over (nor ask it for a checkpoint on
    every pass). A gang that has not trained since its resume is never asked to grow; a shrink
    never waits for it. Default 300; 0 with ``recovery.inProcessSwitch``, whose grow restarts
    nothing (a pause of seconds while the new pods join), and whose grows that do not pay
    ``onlyWhenItPays`` holds back (measured on nine spot traces: docs/goodput.md)."""
    settle_seconds: int = Field(default=60, ge=0, le=86400)
    """When more pods fit than the gang runs, but not all ``replicas``, how long that room must
    have been there before the gang grows to it: a grow restarts the whole gang, and spot nodes
    come back in bursts, so waiting a little for the rest makes one grow to the full size out of
    two (the grow to ``replicas`` itself never waits for it). Counted from when the partial room
    was first seen (``status.growRoomSince``), alongside ``minIntervalSeconds``. Default 60, as
    ``shrinkAfterSeconds``: the same wait for the full gang before settling for fewer."""
    only_when_it_pays: bool = True
    """Grow only when the pods it adds are expected to train, before the gang's next
    interruption, more than the grow's pause costs the whole gang: ``(target - size) x M >
    target x P``, with ``M`` the job's mean time between interruptions and ``P`` the mean pause
    of its grows and re-shrinks (of all its restarts before one), both from its own history
    (``status.goodput``). A grow that does not pay yet is
    held back, said in ``status.growDeferred``, and looked at again on every pass (more room,
    or a longer time since the last loss, can make it pay). On a cluster where a restart takes
    seconds every grow pays; with GPU-scale restarts of minutes, growing at each returning
    node costs more than it adds (docs/elastic.md). Default true."""
    checkpoint_timeout_seconds: int = Field(default=600, ge=1, le=86400)
    """How long the running gang has to commit the checkpoint the grow asked for. Without that
    commit the grow is abandoned (the gang keeps training at its size) and tried again after
    ``minIntervalSeconds``: the gang is never restarted at a cost of more than the work since the
    requested checkpoint. Default 600."""


class ElasticPolicy(ApiModel):
    """Run the gang at fewer than ``replicas`` pods when spot capacity comes back short."""

    min_replicas: int = Field(ge=1, le=4096)
    """Fewest pods the job may run with (torchrun's minimum nodes). The job never starts below
    it: with fewer fitting nodes it waits Pending with reason ``MinReplicasUnreachable``."""
    shrink_after_seconds: int | None = Field(default=None, ge=0, le=86400)
    """How long an attempt waits for room for the full gang before starting at the size that
    fits (at least ``minReplicas``), counted from when ``minReplicas`` first fit (time with room
    for fewer does not count; the count starts again when the room falls below
    ``minReplicas``). Default 60; 0 with ``recovery.survivors: Stay``, whose kept pods would
    idle through the wait, and whose grow back is a warm join."""
    grow: GrowPolicy = Field(default_factory=GrowPolicy)
    """Growing back when capacity returns."""


SHRINK_AFTER_SECONDS = 60
"""``elastic.shrinkAfterSeconds`` when unset, without ``recovery.survivors: Stay``."""


GROW_MIN_INTERVAL_SECONDS = 300
"""``grow.minIntervalSeconds`` when unset, without ``recovery.inProcessSwitch``."""


def grow_min_interval_seconds(spec: JobSpec) -> int:
    """The wait before a grow in force (``grow.minIntervalSeconds``): the spec's, else 0 with
    ``recovery.inProcessSwitch`` (a grow is a pause of seconds, not a restart), else 300."""
    if spec.elastic is not None and spec.elastic.grow.min_interval_seconds is not None:
        return spec.elastic.grow.min_interval_seconds
    return 0 if spec.recovery.in_process_switch else GROW_MIN_INTERVAL_SECONDS


def shrink_after_seconds(spec: JobSpec) -> int:
    """The wait for the full gang in force (``elastic.shrinkAfterSeconds``): the spec's, else
    0 with ``recovery.survivors: Stay`` (measured: a shrink keeps the pods and the grow back
    is a warm join, so the wait only idles the kept ranks; docs/survivors.md), else 60. 0
    without ``elastic``."""
    if spec.elastic is None:
        return 0
    if spec.elastic.shrink_after_seconds is not None:
        return spec.elastic.shrink_after_seconds
    return 0 if spec.recovery.survivors is Survivors.STAY else SHRINK_AFTER_SECONDS


def training_container(spec: JobSpec) -> ContainerTemplate:
    """The training container: ``containerName``, else the first."""
    for container in spec.template.spec.containers:
        if container.name == spec.container_name:
            return container
    return spec.template.spec.containers[0]


JOB_SPEC_RULES = (
    Rule(
        "!has(self.containerName) || "
        "self.template.spec.containers.exists(c, c.name == self.containerName)",
        "containerName must name one of template.spec.containers",
        lambda spec: (
            spec.container_name is None
            or any(c.name == spec.container_name for c in spec.template.spec.containers)
        ),
        ".containerName",
    ),
    Rule(
        "!has(self.elastic) || self.elastic.minReplicas <= self.replicas",
        "elastic.minReplicas must not exceed replicas (the full size of the gang)",
        lambda spec: spec.elastic is None or spec.elastic.min_replicas <= spec.replicas,
        ".elastic.minReplicas",
    ),
    Rule(
        "!has(self.recovery) || !has(self.recovery.survivors) || "
        "self.recovery.survivors != 'Stay' || self.template.spec.containers.exists(c, "
        "(has(self.containerName) ? c.name == self.containerName : "
        "c.name == self.template.spec.containers[0].name) && has(c.command) && "
        "size(c.command) > 0)",
        "recovery.survivors Stay needs the training container's command in the template: the "
        "operator runs it under the in-pod agent (python -m trainer_runtime.agent -- COMMAND)",
        lambda spec: (
            spec.recovery.survivors is not Survivors.STAY
            or bool(training_container(spec).model_extra.get("command"))
        ),
        ".recovery.survivors",
    ),
    Rule(
        "!has(self.recovery) || !has(self.recovery.spares) || self.recovery.spares == 0 || "
        "(has(self.recovery.survivors) && self.recovery.survivors == 'Stay' && "
        "!has(self.elastic))",
        "recovery.spares needs recovery.survivors Stay and a fixed-size gang (no elastic): a "
        "spare takes a lost rank's place in a gang that keeps its healthy pods, and an elastic "
        "gang grows into free nodes instead",
        lambda spec: (
            spec.recovery.spares == 0
            or (spec.recovery.survivors is Survivors.STAY and spec.elastic is None)
        ),
        ".recovery.spares",
    ),
    Rule(
        "!has(self.recovery) || !has(self.recovery.inProcessSwitch) || "
        "!self.recovery.inProcessSwitch || (has(self.recovery.survivors) && "
        "self.recovery.survivors == 'Stay' && (has(self.elastic) || "
        "(has(self.recovery.spares) && self.recovery.spares > 0)))",
        "recovery.inProcessSwitch needs recovery.survivors Stay and either elastic or "
        "recovery.spares: it switches running workers to a new membership, which only a gang "
        "that keeps its pods and grows, or takes warm spares, has",
        lambda spec: (
            not spec.recovery.in_process_switch
            or (
                spec.recovery.survivors is Survivors.STAY
                and (spec.elastic is not None or spec.recovery.spares > 0)
            )
        ),
        ".recovery.inProcessSwitch",
    ),
    Rule(
        "has(self.runName) == has(oldSelf.runName) && "
        "(!has(self.runName) || self.runName == oldSelf.runName)",
        "runName is immutable",
        None,
        ".runName",
    ),
)


class JobSpec(ApiModel):
    """Desired state of a ResumableTrainingJob."""

    model_config = ConfigDict(json_schema_extra=validations(JOB_SPEC_RULES))

    replicas: int = Field(
        ge=1,
        le=4096,
        json_schema_extra=validations([immutable("replicas")]),
    )
    """Number of pods (torchrun's nodes). With ``processesPerPod`` 1 (the default) a pod is one
    rank and this is the world size. Without ``elastic`` the gang always has exactly this many
    pods; with ``elastic`` this is the full size it shrinks from and grows back to. Immutable."""
    processes_per_pod: int = Field(
        default=1,
        ge=1,
        le=256,
        json_schema_extra=validations([immutable("processesPerPod")]),
    )
    """Training processes in each pod (torchrun's ``--nproc-per-node``; Kubeflow's
    ``nprocPerNode``). The world size is ``replicas * processesPerPod``; each pod gets the ``PET_*``
    variables that make ``torchrun train.py`` start its share of the ranks without flags.
    Default 1. Immutable, like ``replicas``."""
    template: PodTemplate
    """Pod template for every rank. Changes apply from the next attempt on."""
    container_name: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL)
    """The training container, into which the rank environment (docs/operator.md) and the notice
    file are injected. Default: the first container."""
    run_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    )
    """Name of the training run, stable across attempts: checkpoints go under
    ``<checkpoint.dir>/<runName>/``. Default: the job's name. Set at creation or never: it cannot
    be added, changed or removed afterwards."""
    checkpoint: CheckpointLocation = Field(json_schema_extra=validations([immutable("checkpoint")]))
    """Where checkpoints live. Immutable."""
    master_port: int = Field(default=29500, ge=1, le=65535)
    """Port rank 0 listens on for the torch.distributed rendezvous (MASTER_PORT). Default 29500."""
    resume_policy: ResumePolicy = Field(default_factory=ResumePolicy)
    """Failure budget, backoff and quarantine."""
    preemption_signals: PreemptionSignals = Field(default_factory=PreemptionSignals)
    """Node taints and readiness that mean preemption."""
    elastic: ElasticPolicy | None = None
    """Let the gang shrink to the capacity left (down to ``minReplicas``) and grow back to
    ``replicas``. The trainer must resume at another world size (the runtime's ``elastic=True``).
    Omitted: a fixed-size gang. Changes apply from the next attempt on: removing it from a
    shrunk gang drops a pending grow, and the gang keeps its size until its next attempt, which
    has ``replicas`` pods."""
    queue_name: str | None = Field(default=None, min_length=1, max_length=63, pattern=DNS_LABEL)
    """A Kueue LocalQueue: the pods get Kueue's pod-group labels (``kueue.x-k8s.io/queue-name``,
    ``kueue.x-k8s.io/pod-group-name``) and annotation (``kueue.x-k8s.io/pod-group-total-count``)
    so Kueue admits the gang as one workload. On a cluster that does not serve Kueue's API
    (``kueue.x-k8s.io``) it is set aside with a Warning event ``QueueNotServed`` and the gang is
    scheduled as without it. See docs/operator.md, All-or-nothing scheduling."""
    recovery: RecoveryPolicy = Field(default_factory=RecoveryPolicy)
    """What happens to the healthy pods when some of the gang's pods are lost."""
    suspend: bool = False
    """Suspend the job: the gang is deleted (each rank gets its grace period to save) and status
    is kept; setting it back to false starts the next attempt from the last checkpoint."""

    @model_validator(mode="after")
    def _rules(self) -> JobSpec:
        enforce(JOB_SPEC_RULES, self)
        return self


ROOT_RULES = (
    Rule(
        f"self.metadata.name.size() <= {names.MAX_JOB_NAME_LENGTH}",
        f"metadata.name must be at most {names.MAX_JOB_NAME_LENGTH} characters: pod names "
        "<name>-a<attempt>-r<rank> are DNS hostnames (63 characters at most)",
        lambda obj: len(obj.metadata.name) <= names.MAX_JOB_NAME_LENGTH,
    ),
    Rule(
        f"self.metadata.name.matches('{DNS_1035}')",
        "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
        "with a letter): it names the job's headless Service",
        lambda obj: _matches(DNS_1035, obj.metadata.name),
    ),
)
"""Rules on the whole object (metadata.name is only reachable from the schema root); their
``self`` is ``api_types.JobObject``."""

RULES: tuple[Rule, ...] = (
    *ROOT_RULES,
    *JOB_SPEC_RULES,
    *(immutable(f) for f in ("replicas", "processesPerPod", "checkpoint")),
    *CHECKPOINT_RULES,
    *CHECKPOINT_DIR_RULES,
    *RESUME_POLICY_RULES,
    *EXIT_CODE_RULE_RULES,
    *EXIT_CODES_RULES,
    *TEMPLATE_METADATA_RULES,
    *TAINT_KEY_RULES,
)
"""Every CEL rule of the CRD (a test checks the generated schema has no other)."""
