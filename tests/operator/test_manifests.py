"""The exact objects a job gets: pods carry the environment contract, everything is owned."""

from __future__ import annotations

from rtj_operator.api import envvars, names
from rtj_operator.decide.manifests import (
    build_pod,
    build_role,
    build_role_binding,
    build_service,
    build_service_account,
)

from .fakes import UID, make_job

TEMPLATE = {
    "metadata": {"labels": {"team": "ml", names.LABEL_RANK: "spoofed"}, "annotations": {"a": "b"}},
    "spec": {
        "terminationGracePeriodSeconds": 90,
        "restartPolicy": "Never",
        "containers": [
            {"name": "sidecar", "image": "s"},
            {
                "name": "trainer",
                "image": "t",
                "env": [{"name": "RANK", "value": "user-rank"}, {"name": "LR", "value": "$(RANK)"}],
            },
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    },
}


def pod(attempt=3, rank=1, **spec):
    job = make_job(replicas=4, template=TEMPLATE, containerName="trainer", **spec)
    return build_pod(
        job, attempt, rank, resume_from="s3://bucket/ckpt/train/ep1", quarantined=["bad1", "bad2"]
    )


def env_of(p, container=1):
    return {e["name"]: e["value"] for e in p["spec"]["containers"][container]["env"]}


def test_pod_identity_labels_and_owner():
    p = pod()
    meta = p["metadata"]
    assert meta["name"] == "train-a3-r1"
    assert meta["labels"] == {
        "team": "ml",
        names.LABEL_JOB: "train",
        names.LABEL_ATTEMPT: "3",
        names.LABEL_RANK: "1",
    }
    assert meta["annotations"] == {"a": "b"}
    (owner,) = meta["ownerReferences"]
    assert owner["uid"] == UID and owner["controller"] and owner["kind"] == names.KIND
    assert p["spec"]["hostname"] == "train-a3-r1" and p["spec"]["subdomain"] == "train"
    assert p["spec"]["restartPolicy"] == "Never"


def test_pod_environment_is_the_contract():
    env = env_of(pod())
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "0"
    assert env["MASTER_ADDR"] == "train-a3-r0.train" and env["MASTER_PORT"] == "29500"
    assert env["RTJ_ATTEMPT"] == "3" and env["RTJ_POD_NAME"] == "train-a3-r1"
    assert env["RTJ_RESUME_FROM"] == "s3://bucket/ckpt/train/ep1"
    assert env["RTJ_QUARANTINED"] == "bad1,bad2"
    assert env["RTJ_CHECKPOINT_DIR"] == "s3://bucket/ckpt"
    assert env["RTJ_RUN_NAME"] == "train" and env["RTJ_JOB_NAME"] == "train"
    assert env["RTJ_NAMESPACE"] == "ns"
    assert env["RTJ_NOTICE_FILE"] == names.NOTICE_FILE
    assert env["RTJ_GRACE_PERIOD_SECONDS"] == "90"
    assert env["RTJ_REPORT_FILE"] == "/dev/termination-log"
    assert set(envvars.ALL_RTJ) <= env.keys() and set(envvars.TORCH) <= env.keys()


def test_a_kept_worker_waits_out_the_detection_of_a_node_that_died_silently():
    """A worker whose collective failed waits for its membership until the operator can have
    seen the loss: the node controller's grace, then ``nodeNotReadySeconds``; its agent's own
    wait after a worker's failure stays ``RTJ_REJOIN_SECONDS``."""
    env = env_of(pod())
    assert env["RTJ_REJOIN_SECONDS"] == "30"
    assert env["RTJ_LOSS_HOLD_SECONDS"] == str(30 + names.NODE_MONITOR_GRACE_SECONDS + 60)
    env = env_of(pod(preemptionSignals={"nodeNotReadySeconds": 5}))
    assert env["RTJ_LOSS_HOLD_SECONDS"] == str(30 + names.NODE_MONITOR_GRACE_SECONDS + 5)


def test_one_process_per_pod_makes_the_pod_one_torchrun_node():
    env = env_of(pod())
    assert env["PET_NNODES"] == "4" and env["PET_NPROC_PER_NODE"] == "1"
    assert env["PET_NODE_RANK"] == "1"
    assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "train-a3-r0.train"
    assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] == "29500"
    assert set(envvars.TORCHRUN) <= env.keys()


def test_two_processes_per_pod_count_processes_in_rank_and_world_size():
    job = make_job(replicas=3, processesPerPod=2, masterPort=23456)
    envs = [
        env_of(build_pod(job, 0, rank, resume_from="", quarantined=[]), container=0)
        for rank in range(3)
    ]
    assert [e["RANK"] for e in envs] == ["0", "2", "4"]
    assert {e["WORLD_SIZE"] for e in envs} == {"6"}
    assert {e["LOCAL_RANK"] for e in envs} == {"0"}
    assert [e["PET_NODE_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["PET_NNODES"] for e in envs} == {"3"}
    assert {e["PET_NPROC_PER_NODE"] for e in envs} == {"2"}
    assert {e["PET_MASTER_ADDR"] for e in envs} == {"train-a0-r0.train"}
    assert {e["PET_MASTER_PORT"] for e in envs} == {"23456"}


def test_several_processes_per_pod_save_within_torchruns_kill_timeout():
    def budget(grace, per_pod):
        template = {"spec": {**TEMPLATE["spec"], "terminationGracePeriodSeconds": grace}}
        job = make_job(template=template, containerName="trainer", processesPerPod=per_pod)
        env = env_of(build_pod(job, 0, 0, resume_from="", quarantined=[]))
        return int(env["RTJ_GRACE_PERIOD_SECONDS"])

    assert budget(90, 1) == 90
    assert budget(90, 2) == names.TORCHRUN_SHUTDOWN_SECONDS == 30
    assert budget(20, 2) == 20


def test_injected_variables_come_first_and_override_the_users():
    names_in_order = [e["name"] for e in pod()["spec"]["containers"][1]["env"]]
    assert names_in_order[: len(envvars.TORCH)] == list(envvars.TORCH)
    assert names_in_order.count("RANK") == 1
    assert names_in_order[-1] == "LR"  # user variables follow, so $(RANK) expands


def test_only_the_training_container_is_touched():
    p = pod()
    assert "env" not in p["spec"]["containers"][0]
    trainer = p["spec"]["containers"][1]
    assert trainer["terminationMessagePolicy"] == "File"
    assert trainer["terminationMessagePath"] == "/dev/termination-log"


def test_notice_file_is_a_downward_api_volume_of_the_annotation():
    p = pod()
    volumes = {v["name"]: v for v in p["spec"]["volumes"]}
    assert "data" in volumes
    item = volumes[names.NOTICE_VOLUME]["downwardAPI"]["items"][0]
    assert item["fieldRef"]["fieldPath"] == (
        "metadata.annotations['resumable.dev/preemption-notice']"
    )
    assert f"{names.NOTICE_MOUNT_DIR}/{item['path']}" == names.NOTICE_FILE
    mounts = {m["name"]: m for m in p["spec"]["containers"][1]["volumeMounts"]}
    assert mounts[names.NOTICE_VOLUME]["mountPath"] == names.NOTICE_MOUNT_DIR


def test_checkpoint_volume_is_mounted_at_dir():
    p = pod(
        checkpoint={
            "dir": "/ckpt",
            "volumeSource": {"persistentVolumeClaim": {"claimName": "shared"}},
        }
    )
    volumes = {v["name"]: v for v in p["spec"]["volumes"]}
    assert volumes[names.CHECKPOINT_VOLUME]["persistentVolumeClaim"] == {"claimName": "shared"}
    mounts = {m["name"]: m for m in p["spec"]["containers"][1]["volumeMounts"]}
    assert mounts[names.CHECKPOINT_VOLUME]["mountPath"] == "/ckpt"


def test_custom_termination_message_path_is_the_report_file():
    template = {
        "spec": {
            "containers": [
                {
                    "name": "t",
                    "terminationMessagePath": "/tmp/report",
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ]
        }
    }
    job = make_job(template=template)
    p = build_pod(job, 0, 0, resume_from="", quarantined=[])
    assert env_of(p, 0)["RTJ_REPORT_FILE"] == "/tmp/report"
    assert p["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_service_account_defaults_to_the_trainer_identity():
    assert pod()["spec"]["serviceAccountName"] == "train-trainer"
    template = {"spec": {"serviceAccountName": "mine", "containers": [{"name": "t"}]}}
    p = build_pod(make_job(template=template), 0, 0, resume_from="", quarantined=[])
    assert p["spec"]["serviceAccountName"] == "mine"


def test_run_name_and_resume_on_first_attempt():
    job = make_job(runName="llama-7b")
    env = env_of(build_pod(job, 0, 0, resume_from="", quarantined=[]), 0)
    assert env["RTJ_RUN_NAME"] == "llama-7b" and env["RTJ_RESUME_FROM"] == ""
    assert env["RTJ_QUARANTINED"] == "" and env["RTJ_GRACE_PERIOD_SECONDS"] == "30"


def test_service_is_headless_and_publishes_unready_ranks():
    svc = build_service(make_job(masterPort=1234))
    assert svc["metadata"]["name"] == "train"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"] == {names.LABEL_JOB: "train"}
    assert svc["spec"]["ports"][0]["port"] == 1234
    assert svc["metadata"]["ownerReferences"][0]["uid"] == UID


def test_trainer_rbac_is_limited_to_this_and_the_previous_attempts_pods():
    job = make_job(replicas=3)
    (first,) = build_role(job, 0)["rules"]
    assert first["resourceNames"] == ["train-a0-r0", "train-a0-r1", "train-a0-r2"]
    role = build_role(job, 5)
    (rule,) = role["rules"]
    # The previous gang may still be saving inside its grace period and must report it.
    assert rule["resourceNames"] == [
        "train-a4-r0",
        "train-a4-r1",
        "train-a4-r2",
        "train-a5-r0",
        "train-a5-r1",
        "train-a5-r2",
    ]
    assert rule["verbs"] == ["get", "patch"] and rule["resources"] == ["pods"]
    binding = build_role_binding(job)
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "train-trainer"
    assert binding["subjects"][0]["name"] == build_service_account(job)["metadata"]["name"]


def test_trainer_rbac_names_the_standby_pods_that_may_say_they_are_warm():
    """A standby pod writes its readiness on its own pod: the Role names every spare an
    attempt may start, ``recovery.spares`` of a fixed gang, and for an elastic one with Stay
    the places a loss may leave (replicas - minReplicas, restore.py)."""
    stay = {"template": {"spec": {"containers": [{"name": "trainer", "command": ["python"]}]}}}
    spares = make_job(replicas=3, recovery={"survivors": "Stay", "spares": 1}, **stay)
    (rule,) = build_role(spares, 0)["rules"]
    assert [n for n in rule["resourceNames"] if "-s" in n] == ["train-a0-s0"]
    elastic = make_job(
        replicas=4, elastic={"minReplicas": 2}, recovery={"survivors": "Stay"}, **stay
    )
    (rule,) = build_role(elastic, 1)["rules"]
    standby = [n for n in rule["resourceNames"] if "-s" in n]
    assert standby == ["train-a0-s0", "train-a0-s1", "train-a1-s0", "train-a1-s1"]
    (rule,) = build_role(make_job(replicas=4, elastic={"minReplicas": 2}), 1)["rules"]
    assert not [n for n in rule["resourceNames"] if "-s" in n]  # without Stay: none
