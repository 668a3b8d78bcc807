"""docs/spark.md's credential recipes for Databricks, Synapse and Fabric, run on a local Spark
against Azurite over HTTPS taking Entra ID tokens (``--oauth basic``: it checks each token's
audience, issuer and expiry). The platforms' credential calls are stand-ins
(``tests/integrations/spark/platforms``), shipped to the executors as a job's Python files
are: what runs is the bus's side - which call it makes where (the driver, each task), and
that the requests it signs with the answers are taken. What the platforms' real calls return
is not run here (docs/spark.md says what was read where)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ClientAuthenticationError

pytest.importorskip("pyspark", reason="pyspark[sql] is pinned in requirements-dev.txt")

import bus.spark
from bus import Bus
from bus.adapters.azure import AzureStorage
from bus.integrations.spark.credentials import RefreshingToken, StaticToken
from devhost.azurite import Azurite
from tests.integrations.spark.contracts import RecordSale
from tests.integrations.spark.test_spark import data_source, sales
from tests.support import tls

pytestmark = pytest.mark.azurite

PLATFORMS = Path(__file__).parent / "platforms"
LIFETIME = 3600


@pytest.fixture(scope="session")
def azurite_oauth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite over HTTPS, taking bearer tokens; this process trusts its certificate."""
    folder = tmp_path_factory.mktemp("azurite-tls")
    emulator = Azurite(tls=tls.self_signed(folder))
    emulator.start()
    before = os.environ.get("REQUESTS_CA_BUNDLE")
    os.environ["REQUESTS_CA_BUNDLE"] = str(emulator.tls[0])  # type: ignore[index]
    try:
        yield emulator
    finally:
        emulator.stop()
        if before is None:
            os.environ.pop("REQUESTS_CA_BUNDLE", None)
        else:
            os.environ["REQUESTS_CA_BUNDLE"] = before


@pytest.fixture(scope="session")
def calls(spark: Any, azurite_oauth: Azurite,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The stand-ins, shipped to every Python worker and importable on the driver; yields the
    file each call is recorded in. Once per test process: Spark refuses a second file of the
    same name with other contents, and then fails every task after (the test run orders tests
    by duration, so a module's tests need not run together)."""
    folder = tmp_path_factory.mktemp("platforms")
    record = folder / "calls.txt"
    record.touch()
    files = folder / "files"
    files.mkdir()
    for source in PLATFORMS.glob("*.py"):
        shutil.copy(source, files / source.name)
    shutil.copy(tls.__file__, files / "standin_tls.py")
    (files / "standin_config.py").write_text(
        f"CA = {str(azurite_oauth.tls[0])!r}\nCALLS = {str(record)!r}\n"  # type: ignore[index]
        f"LIFETIME = {LIFETIME}\n", encoding="utf-8")
    modules = set(sys.modules)
    for module in sorted(files.iterdir()):  # single files reach every Python worker
        spark.sparkContext.addPyFile(str(module))
    try:
        yield record
    finally:  # the driver forgets them (the executors' workers keep them: nothing else asks)
        for name in set(sys.modules) - modules:
            if name.split(".")[0] in ("databricks", "notebookutils", "standin",
                                      "standin_config", "standin_tls"):
                del sys.modules[name]


def _endpoints(emulator: Azurite) -> str:
    return ";".join(f"{service}={url}" for service, url in emulator.endpoints.items())


def _calls_since(record: Path, start: int) -> set[tuple[str, str, str]]:
    lines = record.read_text(encoding="utf-8").splitlines()[start:]
    return {tuple(line.split()[:3]) for line in lines}  # type: ignore[misc]


def _tokens(emulator: Azurite, prefix: str) -> int:
    client = Bus(AzureStorage.from_connection_string(emulator.connection_string), prefix=prefix)
    return len(client.parts.inbox.all("sink"))


RECIPES = {
    "databricks:bus-storage": {("dbutils.credentials", "driver", "bus-storage"),
                               ("databricks.service_credentials", "task", "bus-storage")},
    "synapse": {("mssparkutils.credentials", "driver", "Storage"),
                ("mssparkutils.credentials", "task", "Storage")},
    "fabric": {("notebookutils.credentials", "driver", "storage"),
               ("notebookutils.credentials", "task", "storage")},
}


@pytest.mark.parametrize("platform", sorted(RECIPES))
def test_a_platform_credential_signs_on_the_driver_and_in_every_task(
        spark: Any, azurite_oauth: Azurite, calls: Path, prefix: str, platform: str) -> None:
    """``platform_credential=`` asks the platform's own call in each process: on Databricks
    ``dbutils`` on the driver and ``databricks.service_credentials`` in tasks (``dbutils``
    is not there in UDFs); on Synapse and Fabric their ``getToken`` with its audience."""
    start = len(calls.read_text(encoding="utf-8").splitlines())
    options = {"endpoints": _endpoints(azurite_oauth), "prefix": prefix,
               "platform_credential": platform}
    bus.spark.subscribe("sink", **options)
    result = bus.spark.publish(sales(spark, 40), RecordSale, destination="sink",
                               key_column="sale_id", **options)
    assert (result.rows, result.published) == (40, 40)
    assert RECIPES[platform] <= _calls_since(calls, start)
    assert _tokens(azurite_oauth, prefix) == 40


@data_source
def test_the_data_source_takes_a_platform_credential_as_an_option(
        spark: Any, azurite_oauth: Azurite, calls: Path, prefix: str) -> None:
    options = {"endpoints": _endpoints(azurite_oauth), "prefix": prefix,
               "platform_credential": "fabric"}
    bus.spark.subscribe("sink", **options)
    start = len(calls.read_text(encoding="utf-8").splitlines())
    (sales(spark, 30).write.format("bus")
     .options(**options, message_type="tests.integrations.spark.contracts:RecordSale",
              destination="sink", key_column="sale_id")
     .mode("append").save())
    assert ("notebookutils.credentials", "task", "storage") in _calls_since(calls, start)
    assert _tokens(azurite_oauth, prefix) == 30


def test_a_refreshing_token_outlives_the_tokens_it_fetches(azurite_oauth: Azurite,
                                                           prefix: str) -> None:
    """A job longer than a token's life: the platform's call is asked again before each token
    expires. (A static token is refused once it has: Azurite checks the expiry.)"""
    fetched: list[str] = []

    def fetch() -> str:
        fetched.append(tls.bearer_token(lifetime=6))
        return fetched[-1]

    refreshing = RefreshingToken(fetch, margin=2)
    static = StaticToken(tls.bearer_token(lifetime=6))
    storages = [AzureStorage.from_endpoints(azurite_oauth.endpoints, credential)
                for credential in (refreshing, static)]
    for number, storage in enumerate(storages):
        storage.queues.create_queue(f"{prefix}q{number}")
    time.sleep(7)  # both first tokens have expired
    storages[0].queues.send(f"{prefix}q0", "after the first token expired")
    assert len(fetched) >= 2
    with pytest.raises(ClientAuthenticationError):  # the service's answer, as the SDK raises it
        storages[1].queues.send(f"{prefix}q1", "with an expired token")


def test_a_platform_missing_in_a_process_says_what_to_pass_instead(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bus.integrations.spark.options import Connection, OptionError

    connection = Connection(account_name="acct", platform_credential="synapse")
    monkeypatch.setitem(sys.modules, "notebookutils", None)  # not importable, stand-in or not
    with pytest.raises(OptionError, match=r"notebookutils cannot be imported in this process "
                                          r"\(the driver.*pass token="):
        connection.credential()
    with pytest.raises(OptionError, match="platform_credential 'databricks': give one of"):
        Connection(account_name="acct", platform_credential="databricks")
    with pytest.raises(OptionError, match="give at most one of token, platform_credential"):
        Connection(account_name="acct", token="t", platform_credential="fabric")


def test_a_refreshing_token_asks_again_only_near_its_expiry() -> None:
    now = [1_000.0]
    fetched: list[str] = []

    def fetch() -> str:
        fetched.append(tls.bearer_token(lifetime=3600, now=now[0]))
        return fetched[-1]

    credential = RefreshingToken(fetch, margin=300, clock=lambda: now[0])
    first = credential.get_token("https://storage.azure.com/.default")
    now[0] += 3000  # 600 s left: still good
    assert credential.get_token().token == first.token and len(fetched) == 1
    now[0] += 301  # within the margin
    assert credential.get_token().token != first.token and len(fetched) == 2
    with pytest.raises(Exception, match="not a token"):
        RefreshingToken(lambda: "").get_token()


def test_a_platform_module_without_the_call_or_a_driver_without_dbutils(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that lacks the documented call names it; a driver-side process without the
    notebook's ``dbutils`` (Spark's own Python workers on the driver) asks the UDFs' API."""
    from types import ModuleType, SimpleNamespace

    from bus.integrations.spark.credentials import PlatformError, platform_credential

    monkeypatch.setitem(sys.modules, "notebookutils", ModuleType("notebookutils"))
    with pytest.raises(PlatformError, match=r"notebookutils has no credentials\.getToken"):
        platform_credential("fabric")
    udfs = ModuleType("databricks.service_credentials")
    asked: list[str] = []
    credential = SimpleNamespace(get_token=lambda *scopes, **kwargs: None)
    udfs.getServiceCredentialsProvider = lambda name: asked.append(name) or credential  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "databricks", ModuleType("databricks"))
    monkeypatch.setitem(sys.modules, "databricks.service_credentials", udfs)
    monkeypatch.setitem(sys.modules, "databricks.sdk", None)
    monkeypatch.setitem(sys.modules, "databricks.sdk.runtime", None)
    assert platform_credential("databricks:bus-storage") is credential
    assert asked == ["bus-storage"]
