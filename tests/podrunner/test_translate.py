"""The pod runner's translation rules, without a cluster: env, paths, ports, files, statuses."""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

import pytest

from tools.podrunner.ports import PortRegistry, hashed_port
from tools.podrunner.processes import Exit
from tools.podrunner.status import ContainerState, phase, pod_status_patch, termination_message
from tools.podrunner.translate import (
    ConfigError,
    Interpreter,
    PathMapper,
    PodAddresses,
    command_line,
    container_env,
    expand,
    field_value,
    rewrite_rendezvous,
)
from tools.podrunner.volumes import PodVolumes, write_atomic_dir

POD = {
    "metadata": {
        "name": "job-a0-r1",
        "namespace": "team",
        "uid": "u-1",
        "labels": {"app": "train", "rank": "1"},
        "annotations": {"note": 'say "hi"'},
    },
    "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": [{"name": "main"}]},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-two"),
        ("$$(A)", "$(A)"),
        ("$(MISSING)", "$(MISSING)"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("end$", "end$"),
    ],
)
def test_expand_like_kubelet(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "two"}.get) == expected


def test_field_refs() -> None:
    addrs = PodAddresses()
    assert field_value(POD, "metadata.name", addrs) == "job-a0-r1"
    assert field_value(POD, "metadata.labels['app']", addrs) == "train"
    assert field_value(POD, "metadata.annotations['absent']", addrs) == ""
    assert field_value(POD, "metadata.labels", addrs) == 'app="train"\nrank="1"'
    assert field_value(POD, "metadata.annotations", addrs) == 'note="say \\"hi\\""'
    assert field_value(POD, "status.podIP", addrs) == "127.0.0.1"
    with pytest.raises(ConfigError):
        field_value(POD, "spec.nope", addrs)


def test_env_order_sources_and_expansion() -> None:
    objects = {
        ("configmaps", "cm"): {"kind": "ConfigMap", "data": {"LR": "0.1", "bad key": "x"}},
        ("secrets", "s"): {"kind": "Secret", "data": {"pw": base64.b64encode(b"hunter2").decode()}},
    }
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CFG_"}],
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "WHO", "value": "$(POD)@$(CFG_LR)/$(LATER)"},
            {"name": "LATER", "value": "x"},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {
                "name": "OPT",
                "valueFrom": {"configMapKeyRef": {"name": "no", "key": "k", "optional": True}},
            },
        ],
    }
    env = container_env(
        POD, container, addrs=PodAddresses(), fetch=lambda k, ns, n: objects.get((k, n))
    )
    assert env["WHO"] == "job-a0-r1@0.1/$(LATER)"  # only earlier variables expand
    assert env["PW"] == "hunter2"
    assert "OPT" not in env and "CFG_bad key" not in env
    with pytest.raises(ConfigError, match="not found"):
        container_env(
            POD,
            {"envFrom": [{"secretRef": {"name": "gone"}}]},
            addrs=PodAddresses(),
            fetch=lambda *_: None,
        )


def test_a_key_ref_says_whether_the_object_or_only_its_key_is_missing() -> None:
    cm = {"kind": "ConfigMap", "data": {"k": "v"}}
    fetch = {("configmaps", "cm"): cm}

    def env_of(kind: str, name: str, key: str) -> dict[str, str]:
        ref = {kind: {"name": name, "key": key}}
        return container_env(
            POD,
            {"env": [{"name": "X", "valueFrom": ref}]},
            addrs=PodAddresses(),
            fetch=lambda k, ns, n: fetch.get((k, n)),
        )

    assert env_of("configMapKeyRef", "cm", "k") == {"X": "v"}
    with pytest.raises(
        ConfigError, match=r"^env X: configMapKeyRef configmap 'cm' has no key 'nope'$"
    ):
        env_of("configMapKeyRef", "cm", "nope")
    with pytest.raises(ConfigError, match=r"^env X: configMapKeyRef configmap 'gone' not found$"):
        env_of("configMapKeyRef", "gone", "k")
    with pytest.raises(ConfigError, match=r"^env X: secretKeyRef secret 'gone' not found$"):
        env_of("secretKeyRef", "gone", "k")


def test_resource_field_refs_take_the_default_divisor_as_the_api_server_stores_it() -> None:
    container = {
        "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "500m"}},
        "env": [
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
            {
                "name": "CPU",  # no cpu limit: the request; divisor as the API server defaults it
                "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}},
            },
            {
                "name": "GPU",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu", "divisor": "1"}},
            },
        ],
    }
    env = container_env(POD, container, addrs=PodAddresses(), fetch=lambda *_: None)
    assert (env["MEM"], env["CPU"], env["GPU"]) == ("1Gi", "500m", "0")
    ref = {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}
    with pytest.raises(ConfigError, match="divisor '1Mi' is not supported"):
        container_env(
            POD,
            {"env": [{"name": "M", "valueFrom": ref}]},
            addrs=PodAddresses(),
            fetch=lambda *_: None,
        )


def test_command_needs_command_and_python_is_swapped() -> None:
    with pytest.raises(ConfigError, match="ignores images"):
        command_line({"args": ["x"]}, {})
    argv = command_line({"command": ["/usr/bin/python3", "-c"], "args": ["$(X)"]}, {"X": "1"})
    interp = Interpreter("/venv/bin/python")
    assert interp.argv(argv) == ["/venv/bin/python", "-c", "1"]
    assert interp.argv(["torchrun", "a.py"])[:3] == [
        "/venv/bin/python",
        "-m",
        "torch.distributed.run",
    ]
    assert interp.argv(["sh", "-c", "x"]) == ["sh", "-c", "x"]


def test_path_mapper_respects_boundaries() -> None:
    m = PathMapper([("/ckpt", "/L/ck"), ("/ckpt/inner", "/L/in"), ("/dev/termination-log", "/L/t")])
    assert m.to_local("/ckpt") == "/L/ck"
    assert m.to_local("/ckpt/run/ep1") == "/L/ck/run/ep1"
    assert m.to_local("/ckpt/inner/x") == "/L/in/x"
    assert m.to_local("--dir=/ckpt/a,/ckpt") == "--dir=/L/ck/a,/L/ck"
    assert m.to_local("cat /dev/termination-log") == "cat /L/t"
    for untouched in ("/ckpts", "s3://b/ckpt", "/x/ckpt", "/ckpt.bak"):
        assert m.to_local(untouched) == untouched
    assert m.to_container('{"uri": "/L/ck/run/ep1"}') == '{"uri": "/ckpt/run/ep1"}'


def no_dns(name: str) -> bool:
    """A resolver that must not be asked."""
    raise AssertionError(f"DNS asked about {name}")


def test_rendezvous_rewrite_and_ports(tmp_path: Path) -> None:
    a, b = PortRegistry(tmp_path), PortRegistry(tmp_path)  # two agent processes, one folder
    env = {"MASTER_ADDR": "job-a0-r0.job", "MASTER_PORT": "29500"}
    note = rewrite_rendezvous(env, "team", resolves=lambda _: False, port_for=a.port_for)
    assert env["MASTER_ADDR"] == "127.0.0.1" and note.notes
    port = int(env["MASTER_PORT"])
    assert 20000 <= port < 45000
    assert b.port_for("team/job-a0-r0.job:29500") == port
    assert b.port_for("team/job-a1-r0.job:29500") != port
    for literal in ("10.0.0.5", "localhost"):
        kept = {"MASTER_ADDR": literal, "MASTER_PORT": "1"}
        rewrite_rendezvous(kept, "team", resolves=lambda _: False, port_for=a.port_for)
        assert kept == {"MASTER_ADDR": literal, "MASTER_PORT": "1"}
    own = {"MASTER_ADDR": "job-a0-r0.job"}
    rewrite_rendezvous(own, "team", resolves=no_dns, port_for=a.port_for, subdomain="job")
    assert own["MASTER_PORT"] == str(port)  # no DNS asked; the default port 29500 is the key
    pet = {"MASTER_ADDR": "job-a0-r0.job", "MASTER_PORT": "29500"}
    pet |= {"PET_MASTER_ADDR": "job-a0-r0.job", "PET_MASTER_PORT": "29500"}
    rewrite_rendezvous(pet, "team", resolves=no_dns, port_for=a.port_for, subdomain="job")
    assert pet["PET_MASTER_ADDR"] == "127.0.0.1" and pet["PET_MASTER_PORT"] == str(port)
    svc = {"MASTER_ADDR": "m.team.svc.cluster.local"}
    rewrite_rendezvous(svc, "team", resolves=lambda _: True, port_for=a.port_for)
    assert svc["MASTER_ADDR"] == "127.0.0.1"


def test_port_registry_skips_a_bound_port(tmp_path: Path) -> None:
    key = "ns/busy:1"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", hashed_port(key)))
        sock.listen()
        assert PortRegistry(tmp_path).port_for(key) != hashed_port(key)


def test_atomic_dir_swaps_whole_volume(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    assert write_atomic_dir(target, {"notice": b"", "sub/x": b"1"})
    first = os.readlink(target / "..data")
    assert not write_atomic_dir(target, {"notice": b"", "sub/x": b"1"})  # unchanged: no swap
    assert write_atomic_dir(target, {"notice": b"go"})
    assert (target / "notice").read_text() == "go"
    assert os.readlink(target / "..data") != first and not (target / first).exists()
    assert not (target / "sub").exists()


def test_exit_codes_and_phases(tmp_path: Path) -> None:
    assert Exit.from_returncode(-15) == Exit(143, 15)
    assert Exit.from_returncode(3) == Exit(3, None)
    ok, bad = ContainerState("a"), ContainerState("b")
    ok.running(10)
    assert phase([ok]) == "Running"
    ok.terminated(0, None, "")
    bad.terminated(137, 9, "")
    assert (ok.reason, bad.reason) == ("Completed", "Error")
    assert phase([ok]) == "Succeeded" and phase([ok, bad]) == "Failed"
    patch = pod_status_patch(POD, [ok, bad], host_ip="127.0.0.1", pod_ip="127.0.0.1")
    assert patch["metadata"]["uid"] == "u-1"
    assert patch["status"]["containerStatuses"][1]["state"]["terminated"]["signal"] == 9
    log, msg = tmp_path / "log", tmp_path / "msg"
    log.write_text("".join(f"line {i}\n" for i in range(200)))
    msg.write_bytes(b"x" * 5000)
    assert len(termination_message(msg, policy="File", exit_code=1, log_path=log)) == 4096
    msg.write_bytes(b"")
    tail = termination_message(msg, policy="FallbackToLogsOnError", exit_code=1, log_path=log)
    assert tail.endswith("line 199\n") and "line 119\n" not in tail
    assert termination_message(msg, policy="FallbackToLogsOnError", exit_code=0, log_path=log) == ""


def refusal(container: dict, objects: dict | None = None) -> str:
    """The CreateContainerConfigError message for ``container`` (its env and command)."""
    found = objects or {}
    with pytest.raises(ConfigError) as caught:
        env = container_env(
            POD, container, addrs=PodAddresses(), fetch=lambda k, ns, n: found.get((k, n))
        )
        command_line(container, env)
    return str(caught.value)


def test_every_refusal_names_the_container_and_the_field() -> None:
    def env_item(source: dict) -> dict:
        return {"name": "main", "command": ["true"], "env": [{"name": "X", "valueFrom": source}]}

    divisor = {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}
    assert refusal(env_item(divisor)) == (
        "container 'main': env X: resourceFieldRef divisor '1Mi' is not supported: only 1 "
        "(the pod runner passes the quantity as written, unconverted)"
    )
    field = refusal(env_item({"fieldRef": {"fieldPath": "spec.nope"}}))
    assert field.startswith(
        "container 'main': env X: fieldRef fieldPath 'spec.nope' is not supported (supported: "
        "metadata.name, "
    )
    assert refusal(env_item({"configMapKeyRef": {"name": "cm", "key": "k"}})) == (
        "container 'main': env X: configMapKeyRef configmap 'cm' not found"
    )
    assert refusal(env_item({"fileKeyRef": {"path": "p", "key": "k"}})) == (
        "container 'main': env X: unsupported valueFrom ['fileKeyRef']"
    )
    env_from = {"name": "main", "command": ["true"], "envFrom": [{"secretRef": {"name": "s"}}]}
    assert refusal(env_from) == "container 'main': envFrom: secret 's' not found"
    assert refusal({"name": "main", "image": "busybox", "args": ["x"]}) == (
        "container 'main': no command: the pod runner ignores images (and their entrypoints), "
        "so the container must say what to run in `command`"
    )


def test_a_volume_refusal_names_the_volume(tmp_path: Path) -> None:
    pod = {
        **POD,
        "spec": {
            **POD["spec"],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "settings"}},
            ],
        },
    }
    volumes = PodVolumes(tmp_path / "pod", tmp_path / "state", lambda *_: None, lambda *_: b"")
    with pytest.raises(ConfigError, match=r"^volume 'cfg': configmap 'settings' not found$"):
        volumes.materialize(pod)
    downward = {"name": "info", "downwardAPI": {"items": [{"path": "x"}]}}
    pod["spec"]["volumes"] = [downward]
    with pytest.raises(ConfigError, match=r"^volume 'info': downwardAPI item 'x' has no source$"):
        volumes.materialize(pod)


def test_host_path_types_are_created_or_checked_as_the_kubelet_does(tmp_path: Path) -> None:
    def materialize(name: str, path: Path, kind: str) -> Path:
        pod = {**POD, "spec": {**POD["spec"], "volumes": [
            {"name": name, "hostPath": {"path": str(path), "type": kind}},
        ]}}  # fmt: skip
        volumes = PodVolumes(tmp_path / "pod", tmp_path / "state", lambda *_: None, lambda *_: b"")
        return volumes.materialize(pod)[name]

    assert materialize("a", tmp_path / "made" / "dir", "DirectoryOrCreate").is_dir()
    assert materialize("b", tmp_path / "plain", "").is_dir()
    made = materialize("c", tmp_path / "made" / "file", "FileOrCreate")
    assert made.is_file() and made.read_bytes() == b""
    assert materialize("d", made, "File") == made
    with pytest.raises(ConfigError, match=r"^volume 'e': hostPath type Directory: .* is not a"):
        materialize("e", tmp_path / "absent", "Directory")
    assert not (tmp_path / "absent").exists()
    with pytest.raises(ConfigError, match=r"^volume 'f': hostPath type File: .* is not a file$"):
        materialize("f", tmp_path / "made", "File")
    with pytest.raises(ConfigError, match=r"^volume 'g': hostPath type FileOrCreate: folder"):
        materialize("g", tmp_path / "nowhere" / "file", "FileOrCreate")
    with pytest.raises(ConfigError, match=r"^volume 'h': hostPath type Socket: .* is not a socket"):
        materialize("h", made, "Socket")


def test_a_retried_materialize_lists_each_downward_volume_once(tmp_path: Path) -> None:
    """A pod waiting in CreateContainerConfigError materializes its volumes again at every
    retry; each retry added the downward-API volume to the refresh list once more."""
    pod = {
        **POD,
        "metadata": {**POD["metadata"], "labels": {"team": "a"}},
        "spec": {
            **POD["spec"],
            "volumes": [
                {
                    "name": "info",
                    "downwardAPI": {
                        "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                    },
                }
            ],
        },
    }
    volumes = PodVolumes(tmp_path / "pod", tmp_path / "state", lambda *_: None, lambda *_: b"")
    for _ in range(3):
        volumes.materialize(pod)
    assert volumes.refreshable == ["info"]


def test_the_port_registry_records_whole_ports(tmp_path: Path) -> None:
    port = PortRegistry(tmp_path).port_for("team/job-a0-r0.job:29500")
    recorded = json.loads((tmp_path / "ports.json").read_text())
    assert recorded["team/job-a0-r0.job:29500"]["port"] == port
    assert isinstance(recorded["team/job-a0-r0.job:29500"]["port"], int)


def test_the_membership_files_rendezvous_is_rewritten_like_master_addr(tmp_path: Path) -> None:
    """The operator's membership annotation names a cluster rendezvous; the pod runner turns it
    into the same loopback port as MASTER_ADDR of that name (one port per name and port)."""
    told = {
        "epoch": 2,
        "nnodes": 3,
        "nodeRank": 1,
        "masterAddr": "job-a0-r0.job",
        "masterPort": 29500,
    }
    pod = {
        **POD,
        "metadata": {
            **POD["metadata"],
            "annotations": {"resumable.dev/membership": json.dumps(told)},
        },
        "spec": {
            **POD["spec"],
            "subdomain": "job",
            "volumes": [
                {
                    "name": "rtj",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "membership",
                                "fieldRef": {
                                    "fieldPath": "metadata.annotations['resumable.dev/membership']"
                                },
                            }
                        ]
                    },
                }
            ],
        },
    }
    registry = PortRegistry(tmp_path / "ports")
    env = {"MASTER_ADDR": "job-a0-r0.job", "MASTER_PORT": "29500"}
    rewrite_rendezvous(
        env,
        POD["metadata"]["namespace"],
        resolves=lambda _: False,
        port_for=registry.port_for,
        subdomain="job",
    )

    def rendezvous(addr: str, port: str, namespace: str, subdomain: str) -> tuple[str, str]:
        local = {"MASTER_ADDR": addr, "MASTER_PORT": port}
        rewrite_rendezvous(
            local,
            namespace,
            resolves=lambda _: False,
            port_for=registry.port_for,
            subdomain=subdomain,
        )
        return local["MASTER_ADDR"], local["MASTER_PORT"]

    volumes = PodVolumes(
        tmp_path / "pod", tmp_path / "state", lambda *_: None, lambda *_: b"", rendezvous=rendezvous
    )
    paths = volumes.materialize(pod)
    written = json.loads((paths["rtj"] / "membership").read_text())
    assert written == {**told, "masterAddr": "127.0.0.1", "masterPort": int(env["MASTER_PORT"])}
