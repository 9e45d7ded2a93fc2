"""The goodput benchmark's recovery milestones with survivors staying (pure logic)."""

from __future__ import annotations

from benchmarks.goodput_phases import Loss, PodSeen, milestones

LOSS = {"n3": Loss(t=10.0, node="n3", pool="elastic", slot=2, notice=False)}


def marks(old: list[PodSeen], new: list[PodSeen]) -> dict[str, float | None]:
    return milestones(old, new, detected=10.5, created=None, runtime={}, losses=LOSS)


def test_the_old_gang_is_gone_when_the_pods_not_kept_are():
    old = [
        PodSeen("r0", 0, 0, "n1", gone=None),
        PodSeen("r1", 0, 1, "n2", gone=None),
        PodSeen("r2", 0, 2, "n3", gone=12.0),
    ]
    kept = [PodSeen(f"r{r}", 1, r, f"n{r + 1}", 10.6, 10.6, 10.6) for r in (0, 1)]
    replacement = PodSeen("a1-r2", 1, 2, "n4", created=10.7, bound=30.0, started=31.0)
    got = marks(old, [*kept, replacement])
    assert got["old_pods_gone"] == 10.0, "the lost node's pod went with the node"
    assert got["pods_created"] == 10.6 and got["bound"] == 30.0 and got["container_started"] == 31.0


def test_when_every_old_pod_stays_nothing_is_waited_for():
    old = [PodSeen("r0", 0, 0, "n1"), PodSeen("r1", 0, 1, "n2")]
    new = [PodSeen("r0", 1, 0, "n1", 11.0, 11.0, 11.0), PodSeen("r1", 1, 1, "n2", 11.0, 11.0, 11.0)]
    assert marks(old, new)["old_pods_gone"] == 10.5


def test_without_survivors_every_old_pod_must_go():
    old = [PodSeen("r0", 0, 0, "n1", finished=13.0), PodSeen("r1", 0, 1, "n3")]
    new = [PodSeen("a1-r0", 1, 0, "n1", 14.0, 14.5, 15.0)]
    assert marks(old, new)["old_pods_gone"] == 13.0
