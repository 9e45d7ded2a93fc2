"""The harness's ports: drawn where no outgoing connection or port-0 listener can take them."""

from __future__ import annotations

import socket

from tools import ports


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = int(ports.PORT_RANGE_FILE.read_text().split()[0])
    drawn = [ports.free_port() for _ in range(50)]
    assert len(set(drawn)) == len(drawn)
    for port in drawn:
        assert ports.LOWEST <= port < min(low, ports.HIGHEST)
        assert port not in ports.AVOID
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", drawn[0]))


def test_a_port_something_listens_on_is_not_handed_out(monkeypatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        # a range of two ports, the first one taken
        monkeypatch.setattr(ports, "LOWEST", taken)
        monkeypatch.setattr(ports, "HIGHEST", taken + 2)
        monkeypatch.setattr(ports, "MIN_ROOM", 2)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: taken + 2)
        assert ports.free_port() == taken + 1
