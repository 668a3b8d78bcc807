"""Misconfiguration fails at start-up (indexing), saying what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import azure.durable_functions as df
import pytest

from bus import Command, ConfigurationError, Context, Endpoint
from bus.hosting.functions import AppConfig, BusFunctions


class Ping(Command):
    key: str


class Pong(Command):
    key: str


def _endpoint() -> Endpoint:
    pings = Endpoint("pings")

    @pings.handles(Ping, partition=lambda m: m.key)
    def ping(message: Ping, ctx: Context) -> None:
        pass

    return pings


ENV = {"AzureWebJobsStorage": "UseDevelopmentStorage=true"}


def test_missing_connection_setting_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as error:
        AppConfig.from_environment({}, tmp_path / "host.json")
    assert "AzureWebJobsStorage" in str(error.value)
    assert "local.settings.json" in str(error.value)


def test_identity_connection_is_accepted(tmp_path: Path) -> None:
    config = AppConfig.from_environment({"AzureWebJobsStorage__accountName": "acct"},
                                        tmp_path / "host.json")
    assert config.connection == "AzureWebJobsStorage"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as error:
        AppConfig.from_environment({"BUS_PREFIX": "Bad-Prefix",
                                    "BUS_INLINE_DISPATCH_MAX": "many"}, tmp_path / "host.json")
    text = str(error.value)
    assert "AzureWebJobsStorage" in text and "BUS_PREFIX" in text
    assert "BUS_INLINE_DISPATCH_MAX='many' is not a number" in text


def test_max_dequeue_count_comes_from_host_json(tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"extensions": {"queues": {"maxDequeueCount": 3}}}))
    functions = BusFunctions([_endpoint()], environ=ENV, host_json=host)
    assert functions.bus.settings.max_delivery_count == 3
    host.write_text(json.dumps({"extensions": {"queues": {"maxDequeueCount": 0}}}))
    with pytest.raises(ConfigurationError, match="maxDequeueCount"):
        BusFunctions([_endpoint()], environ=ENV, host_json=host)


def test_unknown_endpoint_fails(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown endpoint.*'nowhere'.*defines pings"):
        BusFunctions([_endpoint()], environ={**ENV, "BUS_ENDPOINTS": "pings, nowhere"},
                     host_json=tmp_path / "host.json")


def test_endpoint_subset_and_empty_endpoint(tmp_path: Path) -> None:
    pongs = Endpoint("pongs")
    pongs.handles(Pong, partition=lambda m: m.key)(lambda message, ctx: None)
    app = df.DFApp()
    app.register_functions(BusFunctions([_endpoint(), pongs], environ={
        **ENV, "BUS_ENDPOINTS": "pongs"}, host_json=tmp_path / "host.json"))
    names = {f.get_function_name() for f in app.get_functions()}
    assert "bus_endpoint_pongs" in names and "bus_endpoint_pings" not in names
    with pytest.raises(ConfigurationError, match="'idle' has no handler"):
        BusFunctions([_endpoint(), Endpoint("idle")], environ=ENV,
                     host_json=tmp_path / "host.json")


def test_delivery_threads_setting(tmp_path: Path) -> None:
    """BUS_DELIVERY_THREADS gives the queue triggers a pool of the bus's own (32 by default);
    0 leaves the event loop's default executor."""
    default = BusFunctions([_endpoint()], environ=ENV, host_json=tmp_path / "host.json")
    assert default.config.delivery_threads == 32 and default.delivery_executor is not None
    assert default.delivery_executor._max_workers == 32
    loop = BusFunctions([_endpoint()], environ={**ENV, "BUS_DELIVERY_THREADS": "0"},
                        host_json=tmp_path / "host.json")
    assert loop.delivery_executor is None
    sized = BusFunctions([_endpoint()], environ={**ENV, "BUS_DELIVERY_THREADS": "12"},
                         host_json=tmp_path / "host.json")
    assert sized.delivery_executor is not None and sized.delivery_executor._max_workers == 12
    with pytest.raises(ConfigurationError, match="BUS_DELIVERY_THREADS='-1' must not be"):
        AppConfig.from_environment({**ENV, "BUS_DELIVERY_THREADS": "-1"},
                                   tmp_path / "host.json")
