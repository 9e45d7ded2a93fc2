"""What starting a pod's containers here takes: its volumes, its service-account folder and one
launch plan per container (command line, environment and paths mapped from the image's to this
machine's), built from the pod's spec and the objects it refers to.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.kubeapi import ApiError, Kube, Obj

from .ports import PortRegistry
from .processes import Watchdog
from .serviceaccount import ENV_DIR as SA_ENV_DIR
from .serviceaccount import MOUNT_PATH as SA_MOUNT_PATH
from .serviceaccount import ServiceAccountFolder, automounts, is_token_volume
from .translate import (
    ConfigError,
    Interpreter,
    PathMapper,
    PodAddresses,
    command_line,
    container_env,
    rewrite_rendezvous,
)
from .volumes import PodVolumes

log = logging.getLogger("podrunner")

DEFAULT_TERMINATION_PATH = "/dev/termination-log"


@dataclass
class Context:
    """Everything a pod worker needs from its agent."""

    kube: Kube
    workdir: Path
    state_dir: Path
    interpreter: Interpreter
    cwd: str
    python_path: list[str]
    watchdog: Watchdog
    ports: PortRegistry
    base_env: dict[str, str]
    addrs: PodAddresses = field(default_factory=PodAddresses)
    shutdown_grace_s: float = 30.0
    resolves: Callable[[str], bool] = field(default=lambda name: False)
    image_paths: list[tuple[str, str]] = field(default_factory=list)
    """(path in the image, local folder): what stands in for the ignored image's files."""

    def pod_dir(self, uid: str) -> Path:
        """Volumes and termination files of one pod (removed with the pod)."""
        return self.workdir / "pods" / uid

    def log_dir(self, pod: Obj) -> Path:
        """Container logs of one pod (kept after the pod is gone, like /var/log/pods)."""
        meta = pod["metadata"]
        return self.workdir / "logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


@dataclass
class Plan:
    """How to start one container here."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: Path
    termination_path: Path
    termination_policy: str
    mapper: PathMapper


class PodPreparation:
    """One pod's volumes, service-account folder and container plans (``build``), kept for
    the pod's life: updates refresh the volumes and the token in place."""

    def __init__(self, ctx: Context, pod: Obj) -> None:
        meta = pod["metadata"]
        self.ctx = ctx
        self.uid: str = meta["uid"]
        self.label = f"{meta['namespace']}/{meta['name']}"
        self.plans: dict[str, Plan] = {}
        self.volumes: PodVolumes | None = None
        self.account: ServiceAccountFolder | None = None

    def _local_rendezvous(
        self, addr: str, port: str, namespace: str, subdomain: str
    ) -> tuple[str, str]:
        """A rendezvous address as this machine reaches it (``rewrite_rendezvous``)."""
        env = {"MASTER_ADDR": addr, "MASTER_PORT": port}
        rewrite_rendezvous(
            env,
            namespace,
            resolves=self.ctx.resolves,
            port_for=self.ctx.ports.port_for,
            subdomain=subdomain,
        )
        return env["MASTER_ADDR"], env["MASTER_PORT"]

    def build(self, pod: Obj) -> None:
        """Materialize the volumes (and the service-account folder) and plan each container."""
        ctx = self.ctx
        pod_dir = ctx.pod_dir(self.uid)
        pod_dir.mkdir(parents=True, exist_ok=True)
        if self.volumes is None:
            self.volumes = PodVolumes(
                pod_dir,
                ctx.state_dir,
                self.fetch,
                self.token,
                ctx.addrs,
                rendezvous=self._local_rendezvous,
            )
        paths = self.volumes.materialize(pod)
        namespace = pod["metadata"]["namespace"]
        spec = pod["spec"]
        hostname = spec.get("hostname") or pod["metadata"]["name"]
        if self.account is None and automounts(pod, self.fetch):
            account = ServiceAccountFolder(
                pod_dir / "serviceaccount", self.token_status, ctx.kube.ca_pem
            )
            account.write(pod)
            self.account = account
        token_volumes = {v["name"] for v in spec.get("volumes") or [] if is_token_volume(v)}
        for container in spec["containers"]:
            name = container["name"]
            cdir = pod_dir / "containers" / name
            cdir.mkdir(parents=True, exist_ok=True)
            term_path = cdir / "termination-log"
            term_path.write_bytes(b"")
            mapping = [
                *ctx.image_paths,
                (
                    container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH,
                    str(term_path),
                ),
            ]
            for mount in container.get("volumeMounts") or []:
                local = paths.get(mount["name"])
                if local is None:
                    raise ConfigError(f"volumeMount {mount['name']!r} names no volume")
                if (
                    self.account is not None
                    and mount["name"] in token_volumes
                    and (
                        mount["mountPath"].rstrip("/") == SA_MOUNT_PATH and not mount.get("subPath")
                    )
                ):
                    continue  # the service-account folder stands in for it (CA of the kubeconfig)
                if mount.get("subPath"):
                    local = local / mount["subPath"]
                    if not local.exists():
                        local.mkdir(parents=True, exist_ok=True)
                mapping.append((mount["mountPath"], str(local)))
            # A container's /tmp is its own and goes with the pod: so is this folder (inside
            # the pod's, removed with it), not the host's temporary folder shared by all pods.
            scratch = cdir / "tmp"
            scratch.mkdir(exist_ok=True)
            base = {**ctx.base_env, "HOSTNAME": hostname, "TMPDIR": str(scratch)}
            if self.account is not None:
                if not any(src.rstrip("/") == SA_MOUNT_PATH for src, _ in mapping):
                    mapping.append((SA_MOUNT_PATH, str(self.account.path)))
                base[SA_ENV_DIR] = SA_MOUNT_PATH  # rewritten to the local folder below
            mapper = PathMapper(mapping)
            env = container_env(pod, container, addrs=ctx.addrs, fetch=self.fetch, base=base)
            rewrite = rewrite_rendezvous(
                env,
                namespace,
                resolves=ctx.resolves,
                port_for=ctx.ports.port_for,
                subdomain=spec.get("subdomain", ""),
            )
            for note in rewrite.notes:
                log.info("%s: %s: %s", self.label, name, note)
            argv = ctx.interpreter.argv([mapper.to_local(a) for a in command_line(container, env)])
            env = {k: mapper.to_local(v) for k, v in env.items()}
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in [*env.get("PYTHONPATH", "").split(os.pathsep), *ctx.python_path] if p
            )
            cwd = ctx.cwd
            if container.get("workingDir"):
                local_wd = mapper.to_local(container["workingDir"])
                if os.path.isdir(local_wd):
                    cwd = local_wd
            plan = Plan(
                name,
                argv,
                env,
                cwd,
                ctx.log_dir(pod) / f"{name}.log",
                term_path,
                container.get("terminationMessagePolicy", "File"),
                mapper,
            )
            (cdir / "launch.json").write_text(
                json.dumps(
                    {"argv": argv, "env": env, "cwd": cwd, "log": str(plan.log_path)}, indent=1
                )
            )
            self.plans[name] = plan

    def fetch(self, plural: str, namespace: str, name: str) -> Obj | None:
        """An object the pod refers to (ConfigMap, Secret, ServiceAccount), or None."""
        return self.ctx.kube.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")

    def token(self, pod: Obj, source: Obj) -> bytes:
        """A projected volume's token (empty when refused)."""
        status = self.token_status(
            pod, int(source.get("expirationSeconds", 3600)), source.get("audience")
        )
        return str((status or {}).get("token", "")).encode()

    def token_status(self, pod: Obj, seconds: int, audience: str | None = None) -> Obj | None:
        """A TokenRequest for the pod's ServiceAccount, bound to the pod: its status, or None."""
        meta, spec = pod["metadata"], pod["spec"]
        account = spec.get("serviceAccountName") or "default"
        body: Obj = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        if audience:
            body["spec"]["audiences"] = [audience]
        try:
            answer = self.ctx.kube.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
                body=body,
            )
        except (ApiError, OSError) as err:
            log.warning("%s: no service-account token (%s)", self.label, err)
            return None
        return answer.get("status") or {}
