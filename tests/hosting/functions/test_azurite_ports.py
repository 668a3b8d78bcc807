"""Azurite started on ports the project chose: a port another process takes between the choice
and Azurite's listen is chosen again, not a failed test run."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from devhost import azurite as emulator_module
from devhost.azurite import Azurite, PortTaken

pytestmark = pytest.mark.azurite


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def test_a_chosen_port_taken_meanwhile_is_chosen_again(
        taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    choices: list[tuple[int, int, int]] = []
    choose = emulator_module._free_ports

    def first_choice_taken() -> tuple[int, int, int]:
        ports = choose()
        choices.append((taken_port, *ports[1:]) if not choices else ports)
        return choices[-1]

    monkeypatch.setattr(emulator_module, "_free_ports", first_choice_taken)
    emulator = Azurite()
    try:
        emulator.start()
        assert len(choices) == 2 and emulator.ports == choices[1]
        assert taken_port not in emulator.ports
    finally:
        emulator.stop()


def test_ports_given_by_the_caller_are_not_changed(taken_port: int) -> None:
    emulator = Azurite(ports=(taken_port, taken_port + 1, taken_port + 2))
    with pytest.raises(PortTaken, match="EADDRINUSE"):
        emulator.start()
    assert emulator.ports[0] == taken_port
