"""Pod volumes as local folders, and the downward-API files kept current.

Each volume becomes a folder the container's paths are rewritten to (see ``translate``):

- ``emptyDir``: ``<pod dir>/volumes/<name>``, removed with the pod;
- ``hostPath``: the same path on this machine (created for ``""``/``DirectoryOrCreate``);
- ``persistentVolumeClaim``: ``<state dir>/pvc/<namespace>/<claimName>``, shared by every pod
  and every agent process using the claim, which is what a ReadWriteMany checkpoint volume is;
- ``configMap``/``secret``/``downwardAPI``/``projected``: files written from the objects.

File-backed volumes are written the way the kubelet writes them (its "atomic writer"): the
files live in a timestamped folder, ``..data`` is a symlink to it, and every visible name is a
symlink through ``..data``, so one ``rename`` swaps the whole volume and a reader never sees a
half-written file. Downward-API volumes are rewritten whenever the pod's labels or annotations
change, which is how the operator's preemption notice reaches the training process.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtj_operator.api.envvars import MEMBERSHIP_ANNOTATION

from .translate import ConfigError, Fetch, PodAddresses, field_value, object_bytes, resource_value

log = logging.getLogger("podrunner")

Obj = dict[str, Any]
DATA_LINK = "..data"
TokenSource = Callable[[Obj, Obj], bytes]
Rendezvous = Callable[[str, str, str, str], tuple[str, str]]

"""``token(pod, serviceAccountToken source)`` → a service-account token (may be empty)."""


def write_atomic_dir(target: Path, files: dict[str, bytes], mode: int = 0o644) -> bool:
    """Make ``target`` show exactly ``files`` (relative paths); False when nothing changed."""
    target.mkdir(parents=True, exist_ok=True)
    current = target / DATA_LINK
    if current.is_symlink() and _same_content(current, files):
        return False
    stamp = dt.datetime.now(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    fresh = target / stamp
    fresh.mkdir()
    for rel, content in files.items():
        path = fresh / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    old = os.readlink(current) if current.is_symlink() else None
    tmp_link = target / "..data_tmp"
    if tmp_link.is_symlink():
        tmp_link.unlink()
    os.symlink(stamp, tmp_link)
    os.replace(tmp_link, current)
    tops = {rel.split("/", 1)[0] for rel in files}
    for top in tops:
        link = target / top
        if not link.is_symlink():
            if link.exists():
                shutil.rmtree(link) if link.is_dir() else link.unlink()
            os.symlink(f"{DATA_LINK}/{top}", link)
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_symlink() and entry.name not in tops:
            entry.unlink()
    if old and old != stamp:
        shutil.rmtree(target / old, ignore_errors=True)
    return True


def _same_content(data_link: Path, files: dict[str, bytes]) -> bool:
    base = data_link.resolve()
    existing = {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()}
    if existing != set(files):
        return False
    return all((base / rel).read_bytes() == content for rel, content in files.items())


HOST_PATH_CHECKS: dict[str, tuple[str, Callable[[Path], bool]]] = {
    "Directory": ("a directory", Path.is_dir),
    "File": ("a file", Path.is_file),
    "Socket": ("a socket", Path.is_socket),
    "CharDevice": ("a character device", Path.is_char_device),
    "BlockDevice": ("a block device", Path.is_block_device),
}
"""hostPath types that must already exist, as the kubelet checks them before a mount."""


def host_path(source: Obj) -> Path:
    """A hostPath volume's path, created or checked as its ``type`` says (the kubelet's rules;
    ``""`` creates a missing folder too, as a container runtime's bind mount does)."""
    path, kind = Path(source["path"]), source.get("type") or ""
    if kind in ("", "DirectoryOrCreate"):
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        if not path.parent.is_dir():
            raise ConfigError(f"hostPath type FileOrCreate: folder {path.parent} does not exist")
        path.touch(exist_ok=True)
    elif kind in HOST_PATH_CHECKS:
        what, check = HOST_PATH_CHECKS[kind]
        if not check(path):
            raise ConfigError(f"hostPath type {kind}: {path} is not {what}")
    else:
        raise ConfigError(f"hostPath type {kind!r} is not one of the Kubernetes hostPath types")
    return path


@dataclass
class PodVolumes:
    """The local folders of one pod's volumes."""

    pod_dir: Path
    state_dir: Path
    fetch: Fetch
    token: TokenSource
    addrs: PodAddresses = field(default_factory=PodAddresses)
    paths: dict[str, Path] = field(default_factory=dict)
    refreshable: list[str] = field(default_factory=list)
    rendezvous: Rendezvous | None = None
    """The networking stand-in for a rendezvous named in a downward-API file (the operator's
    membership annotation): (address, port, namespace, subdomain) -> local address and port."""

    def materialize(self, pod: Obj) -> dict[str, Path]:
        """Create every volume; ConfigError when one cannot be made yet (retried by the caller)."""
        namespace = pod["metadata"]["namespace"]
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            try:
                self.paths[volume["name"]] = self._materialize_one(pod, volume, namespace)
            except ConfigError as err:
                raise ConfigError(f"volume {volume['name']!r}: {err}") from None
        return self.paths

    def _materialize_one(self, pod: Obj, volume: Obj, namespace: str) -> Path:
        """The local folder of one volume, created and filled."""
        name = volume["name"]
        local = self.pod_dir / "volumes" / name
        if "emptyDir" in volume:
            local.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in volume:
            local = host_path(volume["hostPath"])
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            local = self.state_dir / "pvc" / namespace / claim
            local.mkdir(parents=True, exist_ok=True)
        elif any(k in volume for k in ("configMap", "secret", "downwardAPI", "projected")):
            files, mode = self._files(pod, volume)
            write_atomic_dir(local, files, mode)
            refreshable = "downwardAPI" in volume or "projected" in volume
            if refreshable and name not in self.refreshable:  # materialize is retried
                self.refreshable.append(name)
        else:
            kinds = sorted(k for k in volume if k != "name")
            log.warning(
                "%s/%s: volume %s of kind %s is not supported; using an empty folder",
                namespace,
                pod["metadata"]["name"],
                name,
                kinds,
            )
            local.mkdir(parents=True, exist_ok=True)
        return local

    def refresh(self, pod: Obj) -> list[str]:
        """Rewrite the downward-API (and projected) volumes; the names that changed."""
        changed = []
        volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
        for name in self.refreshable:
            volume = volumes.get(name)
            if volume is None:
                continue
            try:
                files, mode = self._files(pod, volume, refresh=True)
            except ConfigError as err:
                log.warning("volume %s not refreshed: %s", name, err)
                continue
            if write_atomic_dir(self.paths[name], files, mode):
                changed.append(name)
        return changed

    def _files(
        self, pod: Obj, volume: Obj, *, refresh: bool = False
    ) -> tuple[dict[str, bytes], int]:
        namespace = pod["metadata"]["namespace"]
        for kind, key in (("configMap", "configmaps"), ("secret", "secrets")):
            if kind in volume:
                source = volume[kind]
                return (
                    self._object_files(namespace, key, source),
                    int(source.get("defaultMode", 0o644)),
                )
        if "downwardAPI" in volume:
            source = volume["downwardAPI"]
            return self._downward_files(pod, source), int(source.get("defaultMode", 0o644))
        source = volume["projected"]
        files: dict[str, bytes] = {}
        previous = self._current(volume["name"]) if refresh else {}
        for item in source.get("sources") or []:
            if "downwardAPI" in item:
                files.update(self._downward_files(pod, item["downwardAPI"]))
            elif "configMap" in item or "secret" in item:
                kind = "configMap" if "configMap" in item else "secret"
                if refresh:
                    # Only the downward-API part follows the pod; keep what was written.
                    for rel in self._item_paths(item[kind]):
                        if rel in previous:
                            files[rel] = previous[rel]
                    if not item[kind].get("items"):
                        files.update({k: v for k, v in previous.items() if k not in files})
                    continue
                plural = "configmaps" if kind == "configMap" else "secrets"
                files.update(self._object_files(namespace, plural, item[kind]))
            elif "serviceAccountToken" in item:
                path = item["serviceAccountToken"].get("path", "token")
                files[path] = (
                    previous.get(path, b"")
                    if refresh
                    else self.token(pod, item["serviceAccountToken"])
                )
        return files, int(source.get("defaultMode", 0o644))

    @staticmethod
    def _item_paths(source: Obj) -> list[str]:
        return [item["path"] for item in source.get("items") or []]

    def _current(self, name: str) -> dict[str, bytes]:
        data = self.paths.get(name, self.pod_dir / "volumes" / name) / DATA_LINK
        if not data.is_symlink():
            return {}
        base = data.resolve()
        return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}

    def _object_files(self, namespace: str, plural: str, source: Obj) -> dict[str, bytes]:
        name = source.get("name") or source.get("secretName") or ""
        obj = self.fetch(plural, namespace, name)
        if obj is None:
            if source.get("optional"):
                return {}
            raise ConfigError(f"{plural[:-1]} {name!r} not found")
        data = object_bytes(obj)
        items = source.get("items")
        if not items:
            return data
        files = {}
        for item in items:
            if item["key"] in data:
                files[item["path"]] = data[item["key"]]
            elif not source.get("optional"):
                raise ConfigError(f"{plural[:-1]} {name!r} has no key {item['key']!r}")
        return files

    def _downward_files(self, pod: Obj, source: Obj) -> dict[str, bytes]:
        files = {}
        for item in source.get("items") or []:
            if "fieldRef" in item:
                value = field_value(pod, item["fieldRef"]["fieldPath"], self.addrs)
            elif "resourceFieldRef" in item:
                ref = item["resourceFieldRef"]
                containers = {c["name"]: c for c in pod["spec"].get("containers") or []}
                container = containers.get(ref.get("containerName", ""), {})
                value = resource_value(container, ref["resource"], ref.get("divisor"))
            else:
                raise ConfigError(f"downwardAPI item {item.get('path')!r} has no source")
            if self.rendezvous is not None and MEMBERSHIP_ANNOTATION in item.get(
                "fieldRef", {}
            ).get("fieldPath", ""):
                value = self._local_membership(pod, value)
            files[item["path"]] = value.encode()
        return files

    def _local_membership(self, pod: Obj, value: str) -> str:
        """The membership with its rendezvous rewritten like MASTER_ADDR is (translate.py)."""
        try:
            body = json.loads(value)
        except ValueError:
            return value
        if not isinstance(body, dict) or not body.get("masterAddr") or self.rendezvous is None:
            return value
        addr, port = self.rendezvous(
            str(body["masterAddr"]),
            str(body.get("masterPort", 29500)),
            pod["metadata"]["namespace"],
            (pod.get("spec") or {}).get("subdomain", ""),
        )
        return json.dumps({**body, "masterAddr": addr, "masterPort": int(port)})
