"""What a failure means to the job: ``spec.resumePolicy.exitCodeRules``, first match wins.

classify.py decides *whether* an ended attempt is the infrastructure's doing (a preemption) or
the training's (a failure); it cannot know what a given exit code means to a given program. The
user can: exit 2 is argparse's usage error, which no retry fixes; a script that maps
``torch.distributed.DistBackendError`` to exit 75 marks an error a fresh gang on other nodes
usually gets past. Their rules, in order, turn a failure into one of three actions:

* ``Retry``: resubmit as after a failure (same backoff) but against ``maxRetries``, not
  ``backoffLimit``, and never towards quarantine (the rule says the checkpoint is not to blame);
* ``FailJob``: end the job at once;
* ``Count``: a failure like any other (also what a failure no rule matches does).

Only a failure that is the training container's own exit is matched (``RankOutcome.own_exit``):
its code and reason, from its ``state.terminated``. A pod the kubelet failed itself (its own
``activeDeadlineSeconds``, an eviction for its own storage limits) or one that failed before the
training container ended (an init container) has no code of the program's, so it counts. A
preemption never reaches here, whatever its code: the rules cannot turn a lost node into a
failure, nor a failure seen with a dying node into anything but the preemption it is.

Rejected: matching each failed rank and taking the most severe action. A gang's ranks crash
together when one goes, with whatever codes their NCCL timeouts give, so one transient error
would read as the others' unmatched exits; the rank that ended first (``classify.first_to_end``)
is the cause, the others' exits its consequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..api.spec_types import ExitCodeAction, ExitCodeRule
from .classify import RankOutcome


@dataclass(frozen=True)
class ExitDecision:
    """The action for one failure, and the rule that chose it."""

    action: ExitCodeAction
    rule: int | None = None
    """Index of the matching rule in ``exitCodeRules``; None when none matched (Count)."""

    def describe(self) -> str:
        """``exitCodeRules[1] (Retry)``, or an empty string when no rule matched."""
        if self.rule is None:
            return ""
        return f"spec.resumePolicy.exitCodeRules[{self.rule}] ({self.action})"


COUNT = ExitDecision(ExitCodeAction.COUNT)
"""A failure no rule matches: counted against backoffLimit, as without rules."""


def decide(rules: Sequence[ExitCodeRule], failed: RankOutcome) -> ExitDecision:
    """The first rule that matches the failed rank's exit, else Count."""
    if not failed.own_exit:
        return COUNT
    for index, rule in enumerate(rules):
        if rule.matches(failed.exit_code, failed.exit_reason):
            return ExitDecision(rule.action, index)
    return COUNT
