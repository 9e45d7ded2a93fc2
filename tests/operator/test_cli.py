"""The operator's command line refuses flags it cannot work with, naming the flag."""

from __future__ import annotations

import logging

import pytest

from rtj_operator.__main__ import parse_args


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--workers", "-2"], "--workers must be at least 1"),
        (["--resync-seconds", "-1"], "--resync-seconds must be 0"),
        (["--metrics-port", "70000"], "--metrics-port must be a port"),
        (["--metrics-port", "-1"], "--metrics-port must be a port"),
        (["--peering-lifetime", "0"], "--peering-lifetime must be at least 11"),
        (["--peering-lifetime", "5"], "--peering-lifetime must be at least 11"),
        (["--max-pause-seconds", "-1"], "--max-pause-seconds must be 0"),
        (["--peering", ""], "--peering must name"),
        (["--id", ""], "--id must not be empty"),
    ],
)
def test_a_flag_that_cannot_work_is_refused_with_its_name(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["-A", *argv])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


def test_an_empty_namespace_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["-n", ""])
    assert "--namespace must name a namespace" in capsys.readouterr().err


def test_the_documented_defaults_and_limits_are_accepted():
    args = parse_args(["-A"])
    assert (args.workers, args.resync_seconds, args.peering_lifetime) == (8, 300.0, 15)
    assert args.max_pause_seconds is None
    ok = ["--workers", "1", "--resync-seconds", "0", "--metrics-port", "0"]
    assert parse_args(["-A", *ok, "--peering-lifetime", "11", "--max-pause-seconds", "0"])
    # Peering flags do not matter to a standalone replica.
    assert parse_args(["-A", "--standalone", "--peering-lifetime", "0"]).standalone


def test_a_metrics_port_in_use_stops_the_operator_at_once_naming_the_flag(monkeypatch, capsys):
    """kopf retries a failing startup handler every minute: binding the metrics port there left
    a live operator that served no job."""
    import socket

    from rtj_operator import __main__ as cli

    runs = []
    handlers = list(logging.getLogger().handlers)
    monkeypatch.setattr(cli, "KubeApi", lambda: None)
    monkeypatch.setattr(cli.kopf, "run", lambda **kwargs: runs.append(kwargs))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["-A", "--standalone", "--metrics-port", str(port)]
        code = cli.main([*argv, "--metrics-address", "127.0.0.1"])
    assert code == 2 and not runs
    # Nothing configured: a root handler on this (captured) stderr outlived the test and made
    # later tests' log lines fail with "I/O operation on closed file".
    assert logging.getLogger().handlers == handlers
    assert f"--metrics-port {port} on --metrics-address 127.0.0.1: cannot listen" in (
        capsys.readouterr().err
    )


def test_the_metrics_port_must_differ_from_the_liveness_port(capsys):
    with pytest.raises(SystemExit):
        parse_args(["-A", "--metrics-port", "8080", "--liveness", "http://0.0.0.0:8080/healthz"])
    assert "--metrics-port 8080 is the port of --liveness" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("notaurl", "--liveness must be an http:// URL"),
        ("https://0.0.0.0:8080/healthz", "--liveness must be an http:// URL"),
        ("http://0.0.0.0:99999/healthz", "--liveness must have a port 0-65535"),
    ],
)
def test_a_liveness_url_kopf_cannot_serve_is_refused_with_its_name(url, named, capsys):
    """kopf raised "Unsupported scheme" or urllib's port error inside its running loop: a
    traceback and exit code 1, naming no flag."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(["-A", "--liveness", url])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


def test_a_liveness_port_in_use_stops_the_operator_at_once_naming_the_flag():
    """The real command line: kopf bound the port inside its loop, and a port in use ended the
    process with an aiohttp traceback and exit code 1."""
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        url = f"http://127.0.0.1:{port}/healthz"
        done = subprocess.run(
            [sys.executable, "-m", "rtj_operator", "-A", "--standalone", "--liveness", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert f"--liveness {url}: cannot listen on 127.0.0.1:{port}: Address already in use" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
