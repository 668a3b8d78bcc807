"""The Bicep, read offline (pycep-parser): what it declares, checked against topology.json.

No Bicep compiler runs here, so these tests also do the compiler's share that matters most:
module parameters line up, outputs reference things that exist.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.operations.infra.bicep import (
    INFRA,
    MAIN,
    ROOT,
    TOPOLOGY,
    Resource,
    app_settings,
    chain,
    function,
    is_ref,
    loaded_json,
    modules,
    parse,
    resources,
    topology,
    variable,
)

STORAGE = INFRA / "app" / "storage.bicep"
RBAC = INFRA / "app" / "rbac.bicep"
FUNCTION = INFRA / "app" / "function.bicep"
TOPICS = INFRA / "app" / "topics.bicep"
MONITORING = INFRA / "app" / "monitoring.bicep"
HOST_JSON = ROOT / "host.json"
LOCAL_SETTINGS_SAMPLE = ROOT / "local.settings.sample.json"

QUEUE = "Microsoft.Storage/storageAccounts/queueServices/queues"
TABLE = "Microsoft.Storage/storageAccounts/tableServices/tables"
CONTAINER = "Microsoft.Storage/storageAccounts/blobServices/containers"



def test_every_bicep_file_parses_and_every_module_is_a_local_file() -> None:
    files = sorted(INFRA.rglob("*.bicep"))
    assert len(files) >= 6
    for path in files:
        parse(path)
    for symbol, (path, _) in modules(MAIN).items():
        assert path.exists(), f"module {symbol}: {path} does not exist"
    assert not re.search(r"'(br|ts)[:/]", MAIN.read_text()), "registry modules cannot be checked"


def test_topology_is_loaded_from_the_generated_file() -> None:
    for path in (MAIN, STORAGE, TOPICS):
        assert loaded_json(path, "topology") == TOPOLOGY.resolve(), path


# -- every queue, poison queue, table and container of the topology ------------------------

# (what, resource type, array of topology.json looped over, field of its items; None: the item)
DECLARED = [
    ("queue", QUEUE, "endpoints", "queue"),
    ("poison queue", QUEUE, "endpoints", "poisonQueue"),
    ("state table", TABLE, "endpoints", "stateTable"),
    ("bus-wide table", TABLE, "tables", None),
    ("container", CONTAINER, "containers", None),
]


def declares(declared: dict[str, Resource], type_: str, array: str, field: str | None) -> bool:
    """Whether a resource of ``type_`` is declared for every item of ``topology.<array>``:
    a loop over it, named ``<item>.<field>`` (or ``<item>``)."""
    for resource in declared.values():
        if resource.type != type_ or resource.existing or resource.loop_item is None:
            continue
        name = (resource.loop_item,) if field is None else (resource.loop_item, field)
        try:
            declared_name = chain(resource.body["name"])
        except ValueError:
            continue  # a name computed otherwise: not from the topology
        if resource.loop_source == ("topology", array) and declared_name == name:
            return True
    return False


def undeclared(declared: dict[str, Resource]) -> list[str]:
    return [what for what, type_, array, field in DECLARED
            if not declares(declared, type_, array, field)]


def test_every_queue_poison_queue_table_and_container_of_the_topology_is_declared() -> None:
    assert undeclared(resources(STORAGE)) == []
    names = topology()
    for _, _, array, field in DECLARED:
        values = [item if field is None else item[field] for item in names[array]]
        assert values and all(isinstance(v, str) and v for v in values), (array, field)
    assert {names["payloadContainer"], names["topicContainer"]} <= set(names["containers"])


@pytest.mark.parametrize("removed", ["poisonQueues", "stateTables", "busTables", "busContainers"])
def test_the_check_notices_a_missing_resource(removed: str) -> None:
    declared = dict(resources(STORAGE))
    del declared[removed]
    assert undeclared(declared)


def test_queues_tables_and_containers_hang_off_the_storage_account() -> None:
    declared = resources(STORAGE)
    for resource in declared.values():
        if resource.type in (QUEUE, TABLE, CONTAINER):
            service = declared[chain(resource.body["parent"])[0]]
            assert resource.type.startswith(service.type + "/"), resource.symbol
            account = declared[chain(service.body["parent"])[0]]
            assert account.type == "Microsoft.Storage/storageAccounts"
            if resource.type == CONTAINER:
                assert resource.body["properties"]["publicAccess"] == "None", resource.symbol


def test_storage_account_is_https_only_tls12_private_and_keyless() -> None:
    account = resources(STORAGE)["storage"].body["properties"]
    assert account["supportsHttpsTrafficOnly"] is True
    assert account["minimumTlsVersion"] == "TLS1_2"
    assert account["allowBlobPublicAccess"] is False
    assert account["allowSharedKeyAccess"] is False
    assert account["defaultToOAuthAuthentication"] is True


# -- topic files ---------------------------------------------------------------------------

def test_topic_files_are_written_from_the_topology_by_a_keyless_script() -> None:
    lines = variable(TOPICS, "topicLines")
    assert chain(lines["loop_type"]["detail"]["array_name"]) == ("topology", "topics")
    item = lines["loop_type"]["detail"]["item_name"]
    assert lines["config"] == f"${{{item}.blob}} ${{base64({item}.content)}}"
    script = resources(TOPICS)["writeTopics"]
    assert script.type == "Microsoft.Resources/deploymentScripts"
    assert script.body["kind"] == "AzureCLI"
    assert script.body["identity"]["type"] == "UserAssigned"
    settings = script.body["properties"]
    environment = {e["name"]: e["value"] for e in settings["environmentVariables"]}
    assert chain(environment["CONTAINER"]) == ("topology", "topicContainer")
    assert function(environment["TOPICS"]) == ("join", {"input_array": "topicLines",
                                                         "delimiter": "\\n"})
    assert function(settings["scriptContent"]) == ("load_text_content",
                                                   {"file_path": "topics.sh", "encoding": None})
    assert "--auth-mode login" in (TOPICS.parent / "topics.sh").read_text()


# -- identities and roles (the roles themselves: test_roles.py) -------------------------------

def test_the_topic_script_writes_the_topic_container_named_by_the_topology() -> None:
    container = resources(RBAC)["topicContainer"]
    assert container.type == CONTAINER and container.existing
    assert chain(container.body["name"]) == ("topicContainerName",)
    _, rbac = modules(MAIN)["rbac"]
    assert chain(rbac["topicContainerName"]) == ("storage", "outputs", "topicContainerName")
    assert chain(parse(STORAGE)["outputs"]["topicContainerName"]["value"]) == (
        "topology", "topicContainer")


def test_main_wires_the_identities_the_app_and_the_script_run_as() -> None:
    called = modules(MAIN)
    _, rbac = called["rbac"]
    _, app = called["functionApp"]
    _, topics = called["topics"]
    assert chain(rbac["appPrincipalId"]) == ("appIdentity", "properties", "principalId")
    assert chain(app["identityId"]) == ("appIdentity", "id")
    assert chain(app["identityClientId"]) == ("appIdentity", "properties", "clientId")
    assert chain(rbac["topicsPrincipalId"]) == ("topicsIdentity", "properties", "principalId")
    assert chain(topics["identityId"]) == ("topicsIdentity", "id")
    identities = resources(MAIN)
    for symbol in ("appIdentity", "topicsIdentity"):
        assert identities[symbol].type == "Microsoft.ManagedIdentity/userAssignedIdentities"
    assert "rbac" in [str(d) for d in parse(MAIN)["modules"]["functionApp"]["config"]
                      .get("dependsOn", [])], "the app should start once its roles exist"


# -- the Function App ----------------------------------------------------------------------

def test_function_app_is_linux_flex_consumption_python_313_with_its_identity() -> None:
    declared = resources(FUNCTION)
    plan, site = declared["plan"].body, declared["functionApp"].body
    assert plan["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    assert plan["properties"]["reserved"] is True
    assert site["kind"] == "functionapp,linux"
    assert site["identity"]["type"] == "UserAssigned"
    config = site["properties"]["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.13"}
    deployment = config["deployment"]["storage"]
    assert deployment["type"] == "blobContainer"
    assert deployment["authentication"] == {"type": "UserAssignedIdentity",
                                            "userAssignedIdentityResourceId":
                                                "deploymentIdentityId"}
    assert deployment["value"].endswith("${deploymentContainerName}")


def host_json() -> dict[str, Any]:
    return dict(json.loads(HOST_JSON.read_text(encoding="utf-8")))


def decorators(path: Path, param: str) -> dict[str, Any]:
    """A parameter's decorators, by type (``min_value``, ``max_length``, ...)."""
    return {d["type"]: d.get("argument") for d in declared_params(path)[param]["decorators"]}


def test_function_app_sets_no_client_certificate_properties() -> None:
    """Flex Consumption does not support certificate features, client certificates included."""
    site = resources(FUNCTION)["functionApp"].body["properties"]
    assert not {"clientCertEnabled", "clientCertMode", "clientCertExclusionPaths"} & set(site)
    skips = dict(re.findall(r"checkov:skip=(CKV_\w+):\s*(.+)$", FUNCTION.read_text(),
                            flags=re.MULTILINE))
    assert "Flex Consumption" in skips.get("CKV_AZURE_17", ""), \
        "checkov's client-certificate check needs a skip saying why (Flex does not support it)"


@pytest.mark.parametrize("path", [MAIN, FUNCTION], ids=lambda p: p.name)
def test_maximum_instance_count_is_within_flex_consumption_limits(path: Path) -> None:
    limits = decorators(path, "maximumInstanceCount")
    assert (limits.get("min_value"), limits.get("max_value")) == (40, 1000), path.name
    default = declared_params(path)["maximumInstanceCount"]["default"]
    assert 40 <= default <= 1000
    values = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert 40 <= values["maximumInstanceCount"]["value"] <= 1000


TASK_HUB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{2,44}")  # letters and digits, 3-45, a letter first


def test_the_durable_task_hub_is_an_app_setting_derived_from_the_app_name() -> None:
    assert host_json()["extensions"]["durableTask"]["hubName"] == "%BUS_DURABLE_HUB%"
    settings = app_settings(resources(FUNCTION)["functionApp"])
    assert settings.get("BUS_DURABLE_HUB") == "durableHubName" and is_ref(
        settings["BUS_DURABLE_HUB"]), "BUS_DURABLE_HUB must come from the durableHubName param"
    limits = decorators(FUNCTION, "durableHubName")
    assert (limits.get("min_length"), limits.get("max_length")) == (3, 45)
    # The default: take('<letters>${replace(name, '-', '')}', 45), evaluated here for app names.
    call = function(declared_params(FUNCTION)["durableHubName"]["default"])
    assert call is not None and call[0] == "take" and call[1]["number_to_take"] == 45, call
    shape = re.fullmatch(r"([A-Za-z][A-Za-z0-9]*)\$\{replace\(name, '-', ''\)\}",
                         str(call[1]["original_value"]))
    assert shape, f"unexpected derivation {call[1]['original_value']!r}"
    _, app = modules(MAIN)["functionApp"]
    # main.bicep passes the same derivation (test_roles.py: storage.bicep names the hub's
    # containers after it).
    assert chain(app["name"]) == ("functionAppName",) and app["durableHubName"] == "durableHubName"
    abbreviations = json.loads((INFRA / "abbreviations.json").read_text())
    deployed = abbreviations["webSitesFunctions"] + "a1b2c3d4e5f6g"  # + uniqueString: 13 chars
    for app_name in (deployed, "ab", "9lives", "my-app-" + "x" * 53, "a-" * 30):
        hub = (shape.group(1) + app_name.replace("-", ""))[:45]
        assert TASK_HUB_NAME.fullmatch(hub), (app_name, hub)
    local = json.loads(LOCAL_SETTINGS_SAMPLE.read_text())["Values"]
    assert TASK_HUB_NAME.fullmatch(local.get("BUS_DURABLE_HUB", "")), \
        "local.settings.sample.json needs a BUS_DURABLE_HUB for the local host"


def test_the_durable_group_keeps_one_always_ready_instance() -> None:
    config = resources(FUNCTION)["functionApp"].body["properties"]["functionAppConfig"]
    always_ready = config["scaleAndConcurrency"].get("alwaysReady", [])
    assert {"name": "durable", "instanceCount": 1} in always_ready


def timespan_seconds(text: str) -> float:
    """A .NET TimeSpan string, ``[d.]hh:mm:ss[.fff]``, in seconds."""
    match = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)", text)
    assert match, f"not a TimeSpan: {text!r}"
    days, hours, minutes, seconds = match.groups()
    return ((int(days or 0) * 24 + int(hours)) * 60 + int(minutes)) * 60 + float(seconds)


def test_durable_queue_polling_interval_is_at_most_10_seconds() -> None:
    provider = host_json()["extensions"]["durableTask"].get("storageProvider", {})
    interval = provider.get("maxQueuePollingInterval")
    assert interval is not None, "the default (30 s) is too slow on Flex Consumption"
    assert 0 < timespan_seconds(interval) <= 10
    assert timespan_seconds("1.00:00:10") == 86410 and timespan_seconds("00:00:02.5") == 2.5


def test_app_settings_are_identity_based_with_no_keys() -> None:
    settings = app_settings(resources(FUNCTION)["functionApp"])
    assert chain(settings["AzureWebJobsStorage__accountName"]) == ("storage", "name")
    assert settings["AzureWebJobsStorage__credential"] == "managedidentity"
    assert is_ref(settings["AzureWebJobsStorage__clientId"])
    # DefaultAzureCredential in the bus picks the user-assigned identity by AZURE_CLIENT_ID.
    assert settings["AZURE_CLIENT_ID"] == settings["AzureWebJobsStorage__clientId"]
    assert "AzureWebJobsStorage" not in settings, "a connection string would carry a key"
    # Flex Consumption sets the runtime in functionAppConfig and rejects these settings.
    assert not {"FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION"} & set(settings)
    for name in settings:
        if "CONNECTION" in name.upper() or "KEY" in name.upper():
            assert name == "APPLICATIONINSIGHTS_CONNECTION_STRING", name
    for path in INFRA.rglob("*.bicep"):
        text = path.read_text()
        assert "listKeys" not in text and "AccountKey" not in text, path


def test_every_setting_the_bus_reads_is_set_and_the_prefix_comes_from_the_topology() -> None:
    config = Path(__file__).resolve().parents[3] / "bus" / "hosting" / "functions" / "config.py"
    read = set(re.findall(r"\"(BUS_[A-Z_]+)\"", config.read_text())) - {"BUS_CONNECTION"}
    settings = app_settings(resources(FUNCTION)["functionApp"])
    assert read <= set(settings), f"not set: {read - set(settings)}"
    assert settings["BUS_PREFIX"] == "busPrefix"
    _, app = modules(MAIN)["functionApp"]
    assert chain(app["busPrefix"]) == ("topology", "prefix")


# -- modules and outputs: the compiler's checks, done here -----------------------------------

def declared_params(path: Path) -> dict[str, dict[str, Any]]:
    return dict(parse(path).get("parameters", {}))


def test_module_calls_pass_declared_params_and_every_required_one() -> None:
    for symbol, (path, passed) in modules(MAIN).items():
        params = declared_params(path)
        assert set(passed) <= set(params), f"{symbol}: unknown params {set(passed) - set(params)}"
        required = {name for name, p in params.items() if p.get("default") is None}
        assert required <= set(passed), f"{symbol}: missing params {required - set(passed)}"


def test_parameters_file_sets_only_declared_params_and_the_required_ones() -> None:
    import json

    values = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    params = declared_params(MAIN)
    assert set(values) <= set(params)
    assert {n for n, p in params.items() if p.get("default") is None} <= set(values)
    for name, entry in values.items():
        for decorator in params[name]["decorators"]:
            if decorator["type"] == "allowed":
                assert entry["value"] in decorator["argument"], name


def resolves(path: Path, expression: Any) -> bool:
    """Whether an output's value refers to something ``path`` declares."""
    document = parse(path)
    call = function(expression)
    if call is not None:
        if call[0] in ("tenant", "resource_group", "subscription"):
            return True
        return all(resolves(path, argument) for argument in call[1].values()
                   if isinstance(argument, dict) or is_ref(argument))
    head, *rest = chain(expression)
    if head in document.get("modules", {}):
        module_path, _ = modules(path)[head]
        assert rest[:1] == ["outputs"], expression
        return rest[1] in parse(module_path).get("outputs", {})
    if head in document.get("variables", {}) and loaded_json(path, head):
        data: Any = topology() if loaded_json(path, head) == TOPOLOGY.resolve() else None
        return data is not None and rest[0] in data
    return (head in document.get("resources", {}) or head in document.get("parameters", {})
            or head in document.get("variables", {}))


@pytest.mark.parametrize("path", [MAIN, STORAGE, FUNCTION, MONITORING, TOPICS],
                         ids=lambda p: p.name)
def test_outputs_refer_to_declared_things(path: Path) -> None:
    for name, output in parse(path).get("outputs", {}).items():
        assert resolves(path, output["value"]), f"{path.name}: output {name} refers to nothing"


def test_main_outputs_are_upper_snake_for_azd_and_scripts() -> None:
    outputs = parse(MAIN)["outputs"]
    assert outputs
    for name in outputs:
        assert re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", name), name
    for needed in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_FUNCTION_APP_NAME", "BUS_PREFIX",
                   "APPLICATIONINSIGHTS_CONNECTION_STRING"):
        assert needed in outputs


def test_output_chains_end_at_the_right_property() -> None:
    """The azd sample once output the component's *name* as its connection string."""
    outputs = parse(MAIN)["outputs"]
    expected: dict[str, tuple[Path, str, Callable[[Resource], bool], tuple[str, ...]]] = {
        "APPLICATIONINSIGHTS_CONNECTION_STRING": (
            MONITORING, "connectionString",
            lambda r: r.type == "Microsoft.Insights/components", ("properties",
                                                                  "ConnectionString")),
        "AZURE_STORAGE_ACCOUNT_NAME": (
            STORAGE, "name",
            lambda r: r.type == "Microsoft.Storage/storageAccounts", ("name",)),
        "AZURE_FUNCTION_APP_NAME": (
            FUNCTION, "name", lambda r: r.type == "Microsoft.Web/sites", ("name",)),
    }
    for name, (path, module_output, is_right, tail) in expected.items():
        module, _, output = chain(outputs[name]["value"])
        assert modules(MAIN)[module][0] == path and output == module_output, name
        head, *rest = chain(parse(path)["outputs"][module_output]["value"])
        assert is_right(resources(path)[head]) and tuple(rest) == tail, name


# -- telemetry: OpenTelemetry to Application Insights ---------------------------------------

def test_the_app_sends_opentelemetry_to_application_insights() -> None:
    """host.json's telemetryMode and the worker's switch, as Microsoft's "Use OpenTelemetry
    with Azure Functions" sets them: the host exports OpenTelemetry, and the Python worker
    (azure-functions-runtime) calls configure_azure_monitor() before it loads the app."""
    assert host_json().get("telemetryMode") == "OpenTelemetry"
    settings = app_settings(resources(FUNCTION)["functionApp"])
    assert settings.get("PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY") == "true"
    # The connection string: a parameter of the module, which main.bicep fills from the
    # monitoring module's output, which is the Application Insights component's.
    connection = settings.get("APPLICATIONINSIGHTS_CONNECTION_STRING")
    assert connection == "applicationInsightsConnectionString" and is_ref(connection)
    assert "applicationInsightsConnectionString" in declared_params(FUNCTION)
    _, app = modules(MAIN)["functionApp"]
    assert chain(app["applicationInsightsConnectionString"]) == (
        "monitoring", "outputs", "connectionString")
    output = parse(MONITORING)["outputs"]["connectionString"]
    assert chain(output["value"]) == ("applicationInsights", "properties", "ConnectionString")
    assert resources(MONITORING)["applicationInsights"].type == "Microsoft.Insights/components"


def test_the_local_settings_sample_has_the_telemetry_settings_without_a_secret() -> None:
    text = LOCAL_SETTINGS_SAMPLE.read_text()
    local = json.loads(text)["Values"]  # plain JSON: no comments, which json refuses
    # Off until a developer fills in a connection string: on with an empty one, the worker
    # logs a ValueError traceback from configure_azure_monitor() at every start.
    assert local["PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY"] == "false"
    assert local["APPLICATIONINSIGHTS_CONNECTION_STRING"] == "", \
        "the sample carries no connection string: each developer fills in their own"
