"""Turning a container spec into a local command line: environment, paths and interpreter.

Pure functions, so the rules a kubelet would apply (``$(VAR)`` expansion, downward-API fields)
and the rules only a process-based stand-in needs (mount paths rewritten to local folders, the
image's ``python`` swapped for a local interpreter) are unit-tested without a cluster.

Mount paths are rewritten rather than bind-mounted because the agent runs unprivileged and
without mount namespaces: a path that names a mount (``/etc/resumable/preemption-notice``) is
replaced by the local folder that holds the volume, wherever it appears in an environment value
or an argument. Paths the program builds at run time from other sources are not seen; that is
the documented limit of the approach.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

_PATH_CHARS = r"A-Za-z0-9_.\-"
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class ConfigError(Exception):
    """The container cannot be started as written (a kubelet's CreateContainerConfigError)."""


class PathMapper:
    """Rewrites in-container paths (mount points) to the local paths that stand in for them.

    A path is replaced only where it starts at a word boundary and ends at the end of the
    string or at a path separator, so ``/data`` never rewrites ``/database`` or ``s3://b/data``.
    The longest mount point wins, as nested mounts would in a container.
    """

    def __init__(self, mapping: Iterable[tuple[str, str]]) -> None:
        pairs = [(src.rstrip("/") or "/", dst.rstrip("/") or "/") for src, dst in mapping]
        self.pairs = sorted(pairs, key=lambda p: len(p[0]), reverse=True)
        self._to_local = self._compile(self.pairs)
        self._to_container = self._compile([(d, s) for s, d in self.pairs])

    @staticmethod
    def _compile(pairs: list[tuple[str, str]]) -> tuple[re.Pattern[str], dict[str, str]] | None:
        usable = [(s, d) for s, d in pairs if s != "/"]
        if not usable:
            return None
        usable.sort(key=lambda p: len(p[0]), reverse=True)
        alternatives = "|".join(re.escape(s) for s, _ in usable)
        pattern = re.compile(rf"(?<![{_PATH_CHARS}/:])({alternatives})(?![{_PATH_CHARS}])")
        return pattern, dict(usable)

    @staticmethod
    def _apply(compiled: tuple[re.Pattern[str], dict[str, str]] | None, text: str) -> str:
        if compiled is None or not text:
            return text
        pattern, table = compiled
        return pattern.sub(lambda m: table[m.group(1)], text)

    def to_local(self, text: str) -> str:
        """In-container path(s) in ``text`` → local path(s)."""
        return self._apply(self._to_local, text)

    def to_container(self, text: str) -> str:
        """Local path(s) in ``text`` → the in-container path(s) (for termination messages)."""
        return self._apply(self._to_container, text)


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubelet's ``$(VAR)`` expansion: ``$$`` escapes, an unknown or unclosed reference stays."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char != "$" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end == -1:
                out.append("$(")
                i += 2
                continue
            name = text[i + 2 : end]
            value = lookup(name)
            out.append(value if value is not None else text[i : end + 1])
            i = end + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


def format_map(values: dict[str, str]) -> str:
    """Labels or annotations as the kubelet writes them into a downward-API file."""
    return "\n".join(f"{k}={_go_quote(v)}" for k, v in sorted(values.items()))


def _go_quote(value: str) -> str:
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\r", "\\r")
    )
    return f'"{escaped}"'


@dataclass(frozen=True)
class PodAddresses:
    """The addresses the agent gives a pod (all pods share the host's loopback)."""

    pod_ip: str = "127.0.0.1"
    host_ip: str = "127.0.0.1"


def field_value(pod: Obj, field_path: str, addrs: PodAddresses) -> str:
    """Value of a downward-API ``fieldRef`` (the fields a kubelet supports)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple: dict[str, str] = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": addrs.pod_ip,
        "status.podIPs": addrs.pod_ip,
        "status.hostIP": addrs.host_ip,
        "status.hostIPs": addrs.host_ip,
    }
    if field_path in simple:
        return simple[field_path]
    if field_path in ("metadata.labels", "metadata.annotations"):
        return format_map(meta.get(field_path.split(".", 1)[1]) or {})
    match = _FIELD_KEY.match(field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ConfigError(
        f"fieldRef fieldPath {field_path!r} is not supported (supported: {', '.join(simple)}, "
        "metadata.labels, metadata.annotations, metadata.labels['KEY'], "
        "metadata.annotations['KEY'])"
    )


def resource_value(container: Obj, resource: str, divisor: str | None) -> str:
    """A ``resourceFieldRef``: the limit, else the request, else 0 (divisor 1 only: the API
    server stores the default one as ``"0"``)."""
    resources = container.get("resources") or {}
    kind, _, name = resource.partition(".")
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "limits":
        value = (resources.get("requests") or {}).get(name)
    if divisor not in (None, "", "0", "1"):
        raise ConfigError(
            f"resourceFieldRef divisor {divisor!r} is not supported: only 1 (the pod runner "
            "passes the quantity as written, unconverted)"
        )
    return str(value) if value is not None else "0"


Fetch = Callable[[str, str, str], Obj | None]
"""``fetch(kind, namespace, name)`` → the ConfigMap or Secret (kind ``configmaps``/``secrets``)."""


def object_bytes(obj: Obj) -> dict[str, bytes]:
    """Decoded ``data`` (and ``binaryData``) of a ConfigMap or Secret, as file contents."""
    if obj.get("kind") == "Secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    merged = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    for key, value in (obj.get("binaryData") or {}).items():
        merged[key] = base64.b64decode(value)
    return merged


def object_data(obj: Obj) -> dict[str, str]:
    """Decoded ``data`` of a ConfigMap or Secret, as environment values."""
    return {k: v.decode("utf-8", errors="replace") for k, v in object_bytes(obj).items()}


def container_env(
    pod: Obj,
    container: Obj,
    *,
    addrs: PodAddresses,
    fetch: Fetch,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The container's environment as a kubelet computes it: envFrom, then env, expanded."""
    try:
        return _container_env(pod, container, addrs=addrs, fetch=fetch, base=base)
    except ConfigError as err:
        raise ConfigError(f"{_container_label(container)}{err}") from None


def _container_label(container: Obj) -> str:
    """``container 'main': `` in front of a refusal, so it names the container."""
    return f"container {container['name']!r}: " if container.get("name") else ""


def _container_env(
    pod: Obj,
    container: Obj,
    *,
    addrs: PodAddresses,
    fetch: Fetch,
    base: dict[str, str] | None,
) -> dict[str, str]:
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    env: dict[str, str] = dict(base or {})
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
            ref = source.get(key)
            if not ref:
                continue
            obj = fetch(kind, namespace, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"envFrom: {kind[:-1]} {ref.get('name')!r} not found")
            for name, value in object_data(obj).items():
                if _ENV_NAME.match(prefix + name):
                    env[prefix + name] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(item.get("value", ""), env.get)
            continue
        try:
            value = _env_source(pod, container, item["valueFrom"], addrs=addrs, fetch=fetch)
        except ConfigError as err:
            raise ConfigError(f"env {name}: {err}") from None
        if value is not None:
            env[name] = value
    return env


def _env_source(
    pod: Obj, container: Obj, source: Obj, *, addrs: PodAddresses, fetch: Fetch
) -> str | None:
    """The value of one ``valueFrom``, None for an optional reference to nothing; ConfigError
    names the source and what is wrong."""
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"], addrs)
    if "resourceFieldRef" in source:
        ref = source["resourceFieldRef"]
        return resource_value(container, ref["resource"], ref.get("divisor"))
    for kind, key in (("configmaps", "configMapKeyRef"), ("secrets", "secretKeyRef")):
        ref = source.get(key)
        if not ref:
            continue
        obj = fetch(kind, namespace, ref.get("name", ""))
        data = object_data(obj) if obj is not None else {}
        if ref.get("key") in data:
            return data[ref["key"]]
        if ref.get("optional"):
            return None
        what = f"{key} {kind[:-1]} {ref.get('name')!r}"
        raise ConfigError(  # the object itself missing, or only the key
            f"{what} not found" if obj is None else f"{what} has no key {ref.get('key')!r}"
        )
    raise ConfigError(f"unsupported valueFrom {sorted(source)}")


@dataclass
class Interpreter:
    """What the image's Python commands become on this machine."""

    python: str
    """Absolute path of the interpreter that replaces ``python``/``python3`` (argv[0])."""

    def argv(self, argv: list[str]) -> list[str]:
        """Swap ``python*`` for the local interpreter and ``torchrun`` for its module form."""
        if not argv:
            return argv
        head = argv[0].rsplit("/", 1)[-1]
        if _PYTHON.match(head):
            return [self.python, *argv[1:]]
        if head == "torchrun":
            return [self.python, "-m", "torch.distributed.run", *argv[1:]]
        return argv


def command_line(container: Obj, env: dict[str, str]) -> list[str]:
    """``command + args`` with ``$(VAR)`` expanded; the image is ignored, so a command is needed."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if not command:
        raise ConfigError(
            f"{_container_label(container)}no command: the pod runner ignores images (and "
            "their entrypoints), so the container must say what to run in `command`"
        )
    return [expand(part, env.get) for part in command + args]


@dataclass
class NetworkRewrite:
    """What the networking stand-in changed (for the agent's log)."""

    notes: list[str] = field(default_factory=list)


CLUSTER_SUFFIXES = (".svc", ".svc.cluster.local", ".cluster.local")


def is_ip(value: str) -> bool:
    """Whether ``value`` is an IPv4 or IPv6 literal."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def rewrite_rendezvous(
    env: dict[str, str],
    namespace: str,
    *,
    resolves: Callable[[str], bool],
    port_for: Callable[[str], int],
    subdomain: str = "",
) -> NetworkRewrite:
    """Point MASTER_ADDR/MASTER_PORT (and torchrun's PET_MASTER_ADDR/PORT when they name the
    same rendezvous) at loopback, one port per job attempt.

    A cluster name (``<pod>.<service>``, ``*.svc``) cannot resolve here and every pod shares
    127.0.0.1, so the address becomes loopback and the port a local one chosen per
    (namespace, original address, original port): ranks of one attempt meet, and an old attempt
    still saving in its grace period never collides with the new one. A name under the pod's
    own ``subdomain`` (the operator's ``<rank-0 pod>.<job service>``) is a cluster name without
    asking DNS, which may be slow to say no.
    """
    result = NetworkRewrite()
    addr = env.get("MASTER_ADDR")
    if not addr or is_ip(addr) or addr == "localhost":
        return result
    own = subdomain and (addr.endswith(f".{subdomain}") or f".{subdomain}." in addr)
    cluster_name = own or addr.endswith(CLUSTER_SUFFIXES) or not resolves(addr)
    if not cluster_name:
        return result
    port = env.get("MASTER_PORT", "29500")
    key = f"{namespace}/{addr}:{port}"
    local_port = port_for(key)
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(local_port)
    # torchrun's copies (PET_*, for several processes per pod) name the same rendezvous.
    if env.get("PET_MASTER_ADDR") == addr and env.get("PET_MASTER_PORT", port) == port:
        env["PET_MASTER_ADDR"] = "127.0.0.1"
        env["PET_MASTER_PORT"] = str(local_port)
    result.notes.append(f"MASTER_ADDR {addr}:{port} -> 127.0.0.1:{local_port}")
    return result


def describe(argv: list[str]) -> str:
    """A shell-quoted command line for log lines."""
    text = shlex.join(argv).replace("\n", "\\n")
    return text if len(text) <= 200 else text[:197] + "..."
