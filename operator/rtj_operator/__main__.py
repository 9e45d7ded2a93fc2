"""Command line: ``python -m rtj_operator`` / ``rtj-operator``.

    rtj-operator --all-namespaces --liveness http://0.0.0.0:8080/healthz --metrics-port 9090
    rtj-operator --namespace team-a --namespace 'ml-*' --standalone

kopf watches the jobs and does the peering and the liveness endpoint; everything else (the
watches of the pods and nodes among it) is this package's.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import socket
import sys
from urllib.parse import urlsplit

import kopf

from .act import metrics
from .act.controller import Controller
from .act.handlers import PeeringOptions, QuietEventHandlers, build_registry
from .act.kube import KubeApi, connections_for
from .api import envvars


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Long on purpose: it is the table of the operator's flags, one ``add_argument`` each with its
    help text, read top to bottom as ``--help`` prints it; the checks across flags are
    ``_invalid``'s."""
    parser = argparse.ArgumentParser(
        prog="rtj-operator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="serve ResumableTrainingJobs in every namespace",
    )
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="serve this namespace (repeatable; globs like 'ml-*' work)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (0 or unset: off)",
    )
    parser.add_argument(
        "--metrics-address",
        default="0.0.0.0",  # noqa: S104
        help="address for the metrics server",
    )
    parser.add_argument(
        "--peering",
        default="rtj-operator",
        help="kopf peering object shared by the replicas (default rtj-operator)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; the highest runs, the others stand by "
        "(default: random, so replicas never tie)",
    )
    parser.add_argument("--standalone", action="store_true", help="no peering (a single replica)")
    parser.add_argument(
        "--id",
        default=os.environ.get(envvars.OPERATOR_POD_ID) or None,
        help="peering identity, stable across restarts of this replica so that a restarted "
        "process recognises its own record instead of waiting for it to expire "
        "(default: $POD_ID, which the chart sets to the pod name; else host and process id)",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=int,
        default=15,
        help="seconds a replica's peering record counts without a refresh (refreshed every "
        "5-10 s less); bounds how long a dead replica's record can pause the others "
        "(default 15)",
    )
    parser.add_argument(
        "--max-pause-seconds",
        type=float,
        default=None,
        help="liveness fails once peering has paused this replica this long while no blocking "
        "replica refreshed its record (default: twice the peering lifetime; 0: never)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=300.0,
        help="re-check every job at least this often (0: only on events)",
    )
    parser.add_argument("--workers", type=int, default=8, help="concurrent job reconciles")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    args = parser.parse_args(argv)
    problem = _invalid(args)
    if problem:
        parser.error(problem)  # exits 2 with the usage line and the flag named
    return args


MIN_PEERING_LIFETIME = 11
"""kopf refreshes a record ``lifetime - 5..10`` s after the last refresh (at least 1 s): a shorter
lifetime lets a live replica's record lapse between refreshes, and with it the pause of the
others (0 would make every record dead at once: all replicas active). The chart's minimum too."""


def _invalid(args: argparse.Namespace) -> str | None:
    """Why the parsed flags cannot work (naming the flag and the allowed values), else None.

    Each of these was accepted before and failed silently: ``--workers 0`` started no worker,
    so no job was ever reconciled; a negative ``--resync-seconds`` or ``--max-pause-seconds``
    meant "never" by accident; a short ``--peering-lifetime`` let the replicas run at once.
    """
    if args.workers < 1:
        return f"--workers must be at least 1 (got {args.workers}): no job would be reconciled"
    if args.resync_seconds < 0:
        return f"--resync-seconds must be 0 (only on events) or more (got {args.resync_seconds:g})"
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port must be a port 1-65535, or 0 for off (got {args.metrics_port})"
    if args.liveness is not None:
        problem = _liveness_problem(args.liveness)
        if problem:
            return problem
    live_port = _liveness_address(args.liveness)[1] if args.liveness else None
    if args.metrics_port and args.metrics_port == live_port:
        return f"--metrics-port {args.metrics_port} is the port of --liveness {args.liveness}"
    if any(not ns for ns in args.namespace):
        return "--namespace must name a namespace (got an empty name)"
    if not args.standalone:
        if not args.peering:
            return "--peering must name the peering object (got an empty name)"
        if args.id is not None and not args.id:
            return "--id must not be empty (leave it out for the default identity)"
        if args.peering_lifetime < MIN_PEERING_LIFETIME:
            return (
                f"--peering-lifetime must be at least {MIN_PEERING_LIFETIME} seconds (got "
                f"{args.peering_lifetime}): kopf refreshes a record 5-10 s before it lapses"
            )
        if args.max_pause_seconds is not None and args.max_pause_seconds < 0:
            return f"--max-pause-seconds must be 0 (never) or more (got {args.max_pause_seconds:g})"
    return None


LIVENESS_EXAMPLE = "http://0.0.0.0:8080/healthz"


def _liveness_address(url: str) -> tuple[str, int]:
    """The host and port kopf serves ``--liveness`` on (its defaults: localhost, port 80)."""
    parts = urlsplit(url)
    return parts.hostname or "localhost", 80 if parts.port is None else parts.port


def _liveness_problem(url: str) -> str | None:
    """Why kopf could not serve ``--liveness`` at this URL, else None: it serves only
    ``http://``, and a bad URL was a bare exception (exit 1) once its loop had started."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return f"--liveness must be an http:// URL such as {LIVENESS_EXAMPLE} (got {url!r})"
    try:
        parts.port  # noqa: B018 (urlsplit checks the port's range only when asked)
    except ValueError:
        return f"--liveness must have a port 0-65535 (got {url!r})"
    return None


def _cannot_listen(host: str, port: int) -> str | None:
    """Why nothing can listen on ``host:port`` now (the address is in use, or not this
    machine's), else None. A probe only: the real listener is kopf's, bound later."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.create_server((host, port), family=family):
            return None
    except socket.gaierror as err:
        return f"unknown host ({err.strerror})"
    except OSError as err:
        return os.strerror(err.errno) if err.errno else str(err)


def _bind_listeners(args: argparse.Namespace) -> str | None:
    """Start the metrics server and check that the liveness endpoint can listen; the error
    line to print (the process then exits 2), else None."""
    if args.metrics_port:
        # Bound here, not in a kopf startup handler: kopf retries a failed startup handler every
        # minute, so a port in use left a live process that served no job and said so only in
        # a traceback.
        try:
            metrics.serve(args.metrics_port, args.metrics_address)
        except OSError as err:
            return (
                f"rtj-operator: error: --metrics-port {args.metrics_port} on --metrics-address "
                f"{args.metrics_address}: cannot listen: {err.strerror or err}"
            )
    if args.liveness:
        # kopf binds it inside its running loop, where a failure was a traceback and exit 1.
        host, port = _liveness_address(args.liveness)
        problem = _cannot_listen(host, port)
        if problem:
            return (
                f"rtj-operator: error: --liveness {args.liveness}: cannot listen on "
                f"{host}:{port}: {problem}"
            )
    return None


def _configure_logging(args: argparse.Namespace) -> None:
    """kopf's and the package's log levels; handler chatter hidden unless ``--verbose``."""
    kopf.configure(verbose=args.verbose, quiet=args.quiet)
    logging.getLogger("rtj_operator").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if not args.verbose:
        logging.getLogger("kopf.objects").addFilter(QuietEventHandlers())


def _peering_options(
    args: argparse.Namespace, identity: str, priority: int
) -> PeeringOptions | None:
    """How this replica takes part in peering (None: ``--standalone``)."""
    if args.standalone:
        return None
    max_pause = args.max_pause_seconds
    return PeeringOptions(
        name=args.peering,
        identity=identity,
        priority=priority,
        lifetime=args.peering_lifetime,
        max_pause=2.0 * args.peering_lifetime if max_pause is None else max_pause,
        namespaces=None if args.all_namespaces else tuple(args.namespace),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the operator until SIGINT/SIGTERM."""
    args = parse_args(argv)
    refusal = _bind_listeners(args)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    # Logging is configured only once nothing can refuse the start any more: an early exit
    # leaves the process's logging as it found it.
    _configure_logging(args)
    api = KubeApi(workers=connections_for(args.workers))
    controller = Controller(api, resync_seconds=args.resync_seconds, concurrency=args.workers)
    priority = args.priority if args.priority is not None else random.randint(1, 1_000_000)
    identity = args.id or f"rtj-operator@{socket.gethostname()}/{os.getpid()}"
    registry = build_registry(
        controller,
        api=api,
        peering=_peering_options(args, identity, priority),
        namespaces=None if args.all_namespaces else tuple(args.namespace),
    )
    kopf.run(
        registry=registry,
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        standalone=args.standalone,
        priority=priority,
        identity=identity,  # type: ignore[arg-type]
        # Naming a peering makes it mandatory in kopf, which a standalone run must not be.
        peering_name=None if args.standalone else args.peering,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
