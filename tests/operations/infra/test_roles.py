"""Least privilege in the Bicep: who holds which role on which scope (docs/deploy.md, "Roles").

Every role assignment of every Bicep file is read into a ``Grant``: the principal parameter,
the role (a built-in id, or ``custom:<symbol>`` for a role defined in the file) and the scope,
as a label: ``account``, ``container:topicContainerName``, ``queue:topology.endpoints[*].queue``,
``queue:${sparkReaderQueues[*]}-poison``... A loop over a list variable of names gives one
label per name. Checked by these tests and checkov only: nothing here is deployed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.operations.infra.bicep import (
    INFRA,
    MAIN,
    Resource,
    chain,
    function,
    modules,
    parse,
    resources,
    topology,
    variable,
)

RBAC = INFRA / "app" / "rbac.bicep"
STORAGE = INFRA / "app" / "storage.bicep"
FUNCTION = INFRA / "app" / "function.bicep"
PUBLISHER = INFRA / "app" / "publisher.bicep"

ROLE_ASSIGNMENT = "Microsoft.Authorization/roleAssignments"
ROLE_DEFINITION = "Microsoft.Authorization/roleDefinitions"
KINDS = {
    "Microsoft.Storage/storageAccounts": "account",
    "Microsoft.Storage/storageAccounts/blobServices/containers": "container",
    "Microsoft.Storage/storageAccounts/queueServices/queues": "queue",
    "Microsoft.Storage/storageAccounts/tableServices/tables": "table",
    "Microsoft.Insights/components": "appinsights",
    "Microsoft.Web/sites": "site",
}

QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
QUEUE_MESSAGE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"
QUEUE_DATA_READER = "19e7f393-937e-4f77-808e-94535e297925"
BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
TABLE_DATA_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
TABLE_DATA_READER = "76199698-9eea-4c19-bc75-cec21354c6b6"
MONITORING_METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"
WEBSITE_CONTRIBUTOR = "de139f84-1756-47ae-9be6-808fbbe84772"

# Built-in storage data roles (and whether they can write blobs).
DATA_ROLES = {QUEUE_DATA_CONTRIBUTOR, QUEUE_MESSAGE_SENDER, BLOB_DATA_OWNER,
              BLOB_DATA_CONTRIBUTOR, BLOB_DATA_READER, TABLE_DATA_CONTRIBUTOR,
              "19e7f393-937e-4f77-808e-94535e297925",  # Storage Queue Data Reader
              "8a0f0c08-91a1-4084-bc3d-661d67233fed",  # Storage Queue Data Message Processor
              "76199698-9eea-4c19-bc75-cec21354c6b6",  # Storage Table Data Reader
              "db58b8e5-c6ad-4a2a-8342-4190687cbf4a"}  # Storage Blob Delegator
BLOB_WRITERS = {BLOB_DATA_OWNER, BLOB_DATA_CONTRIBUTOR}

# The only data-plane assignments allowed on the whole account, and why (rbac.bicep says the same):
ACCOUNT_WIDE_ALLOWED = {
    # The Durable task hub creates <hub>-control-NN and <hub>-workitems at start-up.
    ("appPrincipalId", QUEUE_DATA_CONTRIBUTOR),
    # The Durable task hub's <hub>Instances/<hub>History; the host's monthly diagnostic tables.
    ("appPrincipalId", TABLE_DATA_CONTRIBUTOR),
}

PRODUCER_DATA_ACTIONS = {
    "Microsoft.Storage/storageAccounts/tableServices/tables/entities/add/action",
    "Microsoft.Storage/storageAccounts/queueServices/queues/messages/add/action",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action",
}
PROVISIONER_ACTIONS = {
    "Microsoft.Storage/storageAccounts/queueServices/queues/write",
    "Microsoft.Storage/storageAccounts/tableServices/tables/write",
    "Microsoft.Storage/storageAccounts/blobServices/containers/write",
}

ENDPOINT_QUEUES = "queue:topology.endpoints[*].queue"
POISON_QUEUES = "queue:topology.endpoints[*].poisonQueue"
STATE_TABLES = "table:topology.endpoints[*].stateTable"


@dataclass(frozen=True)
class Grant:
    file: str
    symbol: str
    principal: str
    role: str  # a built-in role id, or "custom:<role definition symbol>"
    scope: str  # a label, see the module docstring
    conditional: bool


def role_ids(path: Path) -> dict[str, str]:
    """A file's role-id variables; each must carry a comment naming the role."""
    found = {}
    for name, role_id, comment in re.findall(
            r"^var (\w+) = '([0-9a-f-]{36})'(?: *// *(.*))?$", path.read_text(),
            flags=re.MULTILINE):
        assert comment, f"role id {name} = {role_id} has no comment saying which role it is"
        found[name] = role_id
    return found


def _text(expression: Any) -> str:
    if isinstance(expression, str):
        return str(expression)
    return ".".join(chain(expression))


def scope_labels(declared: dict[str, Resource], path: Path, expression: Any) -> list[str]:
    """The labels of what ``scope: <expression>`` names: one, or one per name of a list
    variable an indexed existing resource loops over."""
    if isinstance(expression, dict) and expression.get("operator", {}).get("type") == \
            "index_accessor":
        target = declared[str(expression["operator"]["operands"]["operand_1"])]
    else:
        head, *rest = chain(expression)
        assert not rest, f"scope {expression!r}: a resource symbol, please"
        target = declared[head]
    kind = KINDS.get(target.type, target.type)
    if kind == "account":
        return ["account"]
    name = _text(target.body["name"])
    if target.loop_item is None:
        return [f"{kind}:{name}"]
    source = ".".join(target.loop_source or ())
    document = parse(path)
    if source in document.get("variables", {}) and isinstance(variable(path, source), list):
        names = [str(v) for v in variable(path, source)]
        return [f"{kind}:{name.replace(target.loop_item, n)}" for n in names]
    item = re.compile(r"\b" + re.escape(target.loop_item) + r"\b")
    return [f"{kind}:{item.sub(source + '[*]', name)}"]


def grants(path: Path) -> list[Grant]:
    declared = resources(path)
    ids = role_ids(path)
    found = []
    for resource in declared.values():
        if resource.type != ROLE_ASSIGNMENT:
            continue
        assert "scope" in resource.body, \
            f"{path.name}: {resource.symbol} has no scope: it would apply to the resource group"
        properties = resource.body["properties"]
        call = function(properties["roleDefinitionId"])
        if call is not None:
            assert call[0] == "subscription_resource_id", resource.symbol
            assert call[1]["resource_type"] == ROLE_DEFINITION
            name = str(call[1]["resource_name_1"])
            if name == resource.loop_item:  # [for role in <list of role-id variables>: ...]
                roles = [ids[r] for r in _role_names(variable(path, resource.loop_source[0]))]
            else:
                roles = [ids[name]]
        else:
            head, tail = chain(properties["roleDefinitionId"])
            assert tail == "id" and declared[head].type == ROLE_DEFINITION, resource.symbol
            roles = [f"custom:{head}"]
        for role in roles:
            for label in scope_labels(declared, path, resource.body["scope"]):
                found.append(Grant(path.name, resource.symbol, str(properties["principalId"]),
                                   role, label, resource.condition is not None))
    return found


def _role_names(value: Any) -> list[str]:
    """The role-id variable names of a list, or of both branches of ``cond ? [] : [...]``."""
    if isinstance(value, list):
        return [str(v) for v in value]
    operands = value["operator"]["operands"]
    return [str(v) for branch in ("true_value", "false_value") for v in operands[branch]]


def all_grants() -> list[Grant]:
    return [g for path in sorted(INFRA.rglob("*.bicep")) for g in grants(path)]


def of(principal: str) -> set[tuple[str, str]]:
    return {(g.role, g.scope) for g in all_grants() if g.principal == principal}


def custom_role(symbol: str) -> dict[str, Any]:
    """The permissions of a role defined in rbac.bicep, list variables resolved."""
    definition = resources(RBAC)[symbol]
    assert definition.type == ROLE_DEFINITION
    properties = definition.body["properties"]
    assert properties["type"] == "CustomRole"
    (permissions,) = properties["permissions"]

    def values(key: str) -> set[str]:
        value = permissions.get(key, [])
        if not isinstance(value, list):
            value = variable(RBAC, str(value))
        return {str(v) for v in value}

    return {key: values(key) for key in ("actions", "notActions", "dataActions",
                                         "notDataActions")} | {
        "assignableScopes": properties["assignableScopes"], "condition": definition.condition}


def is_data_role(role: str) -> bool:
    if role.startswith("custom:"):
        return bool(custom_role(role.removeprefix("custom:"))["dataActions"])
    return role in DATA_ROLES


def writes_blobs(role: str) -> bool:
    if role.startswith("custom:"):
        actions = custom_role(role.removeprefix("custom:"))["dataActions"]
        return any(a.startswith("Microsoft.Storage/storageAccounts/blobServices/containers/blobs/")
                   and not a.endswith("/read") for a in actions) or "*" in actions
    return role in BLOB_WRITERS


# -- the rules -------------------------------------------------------------------------------

def test_no_data_role_on_the_whole_account_but_the_allow_list() -> None:
    """The finding: operator and Spark principals held data roles on the whole account (the
    app-package container included), and the app's Blob Data Owner was account-wide."""
    account_wide = {(g.principal, g.role) for g in all_grants()
                    if g.scope == "account" and is_data_role(g.role)}
    assert account_wide <= ACCOUNT_WIDE_ALLOWED, account_wide - ACCOUNT_WIDE_ALLOWED
    assert account_wide == ACCOUNT_WIDE_ALLOWED, "the allow-list names an assignment that is gone"
    text = RBAC.read_text()
    assert "allow-listed" in text and "Durable" in text, "say why each one is account-wide"


def test_the_package_container_is_writable_by_the_deployment_identity_alone() -> None:
    writers = {(g.principal, g.scope) for g in all_grants() if writes_blobs(g.role)
               and g.scope in ("account", "container:deploymentContainerName")}
    assert writers == {("deployPrincipalId", "container:deploymentContainerName")}
    # ... and nobody else holds anything there, the app's runtime identity included.
    assert {g.principal for g in all_grants()
            if g.scope == "container:deploymentContainerName"} == {"deployPrincipalId"}
    # The deployment identity is the one the platform writes and reads the package with, and
    # it is not the identity the app's code and host run as.
    identities = resources(MAIN)
    assert identities["deployIdentity"].type == "Microsoft.ManagedIdentity/userAssignedIdentities"
    _, rbac = modules(MAIN)["rbac"]
    _, app = modules(MAIN)["functionApp"]
    assert chain(rbac["deployPrincipalId"]) == ("deployIdentity", "properties", "principalId")
    assert chain(rbac["appPrincipalId"]) == ("appIdentity", "properties", "principalId")
    assert chain(app["deploymentIdentityId"]) == ("deployIdentity", "id")
    assert chain(app["identityId"]) == ("appIdentity", "id")
    site = resources(FUNCTION)["functionApp"].body
    storage = site["properties"]["functionAppConfig"]["deployment"]["storage"]
    assert storage["authentication"] == {"type": "UserAssignedIdentity",
                                         "userAssignedIdentityResourceId": "deploymentIdentityId"}
    assert set(site["identity"]["userAssignedIdentities"]) == {"'${identityId}'",
                                                               "'${deploymentIdentityId}'"}
    assert chain(rbac["deploymentContainerName"]) == ("storage", "outputs",
                                                      "deploymentContainerName")
    assert chain(app["deploymentContainerName"]) == ("storage", "outputs",
                                                     "deploymentContainerName")


def test_the_producer_role_has_exactly_the_listed_data_actions() -> None:
    role = custom_role("producerRole")
    assert role["dataActions"] == PRODUCER_DATA_ACTIONS
    assert role["actions"] == role["notActions"] == role["notDataActions"] == set()
    assert role["condition"] == "hasProducer", "created only when a producer is given"
    assert function(role["assignableScopes"][0]) is not None
    assert function(role["assignableScopes"][0])[0] == "resource_group"
    assert of("producerPrincipalId") == {
        ("custom:producerRole", "table:tokensTableName"),
        ("custom:producerRole", ENDPOINT_QUEUES),
        ("custom:producerRole", "container:payloadContainerName"),
    }


def test_the_provisioner_role_creates_if_missing_without_data_access() -> None:
    role = custom_role("provisionerRole")
    assert role["actions"] == PROVISIONER_ACTIONS
    assert role["dataActions"] == role["notActions"] == role["notDataActions"] == set()
    assert role["condition"] == "hasSpark"


def test_each_principal_holds_exactly_its_roles_on_its_scopes() -> None:
    """The table of docs/deploy.md, "Roles"."""
    assert of("appPrincipalId") == {
        (QUEUE_DATA_CONTRIBUTOR, "account"),
        (TABLE_DATA_CONTRIBUTOR, "account"),
        (BLOB_DATA_OWNER, "container:hostContainerNames[*]"),
        (BLOB_DATA_CONTRIBUTOR, "container:durableContainerNames[*]"),
        (BLOB_DATA_CONTRIBUTOR, "container:payloadContainerName"),
        (BLOB_DATA_READER, "container:topicContainerName"),
        (MONITORING_METRICS_PUBLISHER, "appinsights:applicationInsightsName"),
    }
    assert of("deployPrincipalId") == {
        (BLOB_DATA_CONTRIBUTOR, "container:deploymentContainerName")}
    assert of("topicsPrincipalId") == {(BLOB_DATA_CONTRIBUTOR, "container:topicContainerName")}
    assert of("sparkPrincipalId") == {
        (TABLE_DATA_CONTRIBUTOR, "table:tokensTableName"),
        (TABLE_DATA_CONTRIBUTOR, "table:ledgerTableName"),
        (TABLE_DATA_CONTRIBUTOR, "table:sparkStagingTableName"),
        (TABLE_DATA_CONTRIBUTOR, "table:instancesTableName"),
        (BLOB_DATA_CONTRIBUTOR, "container:payloadContainerName"),
        (BLOB_DATA_CONTRIBUTOR, "container:sparkStagingContainerName"),
        (BLOB_DATA_READER, "container:topicContainerName"),
        (QUEUE_MESSAGE_SENDER, ENDPOINT_QUEUES),
        (QUEUE_DATA_CONTRIBUTOR, "queue:sparkReaderQueues[*]"),
        (QUEUE_DATA_CONTRIBUTOR, "queue:${sparkReaderQueues[*]}-poison"),
        ("custom:provisionerRole", ENDPOINT_QUEUES),
        ("custom:provisionerRole", POISON_QUEUES),
        ("custom:provisionerRole", STATE_TABLES),
        ("custom:provisionerRole", "container:topicContainerName"),
    }
    assert of("operatorPrincipalId") == {
        (QUEUE_DATA_CONTRIBUTOR, POISON_QUEUES),
        (QUEUE_MESSAGE_SENDER, ENDPOINT_QUEUES),
        (QUEUE_DATA_READER, ENDPOINT_QUEUES),
        (TABLE_DATA_CONTRIBUTOR, "table:tokensTableName"),
        (TABLE_DATA_CONTRIBUTOR, STATE_TABLES),
        (TABLE_DATA_CONTRIBUTOR, "table:auditTableName"),
        (TABLE_DATA_READER, "table:instancesTableName"),
        (BLOB_DATA_CONTRIBUTOR, "container:payloadContainerName"),
    }
    assert of("publisherPrincipalId") == {(WEBSITE_CONTRIBUTOR, "site:functionAppName")}
    principals = {g.principal for g in all_grants()}
    assert principals == {"appPrincipalId", "deployPrincipalId", "topicsPrincipalId",
                          "producerPrincipalId", "sparkPrincipalId", "operatorPrincipalId",
                          "publisherPrincipalId"}


@pytest.mark.parametrize("principal, condition", [
    ("producerPrincipalId", "hasProducer"), ("sparkPrincipalId", "hasSpark"),
    ("operatorPrincipalId", "hasOperator")])
def test_optional_principals_get_roles_only_when_given(principal: str, condition: str) -> None:
    found = [g for g in grants(RBAC) if g.principal == principal]
    assert found
    declared = resources(RBAC)
    for grant in found:
        assert declared[grant.symbol].condition == condition, grant.symbol
    assert variable(RBAC, condition) == {"operator": {"type": "not", "operands": {
        "bool_value": {"function": {"type": "empty", "parameters": {
            "item_to_test": principal}}}}}}


def test_the_publisher_module_runs_only_for_a_publisher() -> None:
    declaration = parse(MAIN)["modules"]["publisher"]
    assert declaration["config"].get("condition") is not None
    _, params = modules(MAIN)["publisher"]
    assert chain(params["functionAppName"]) == ("functionApp", "outputs", "name")


def test_role_assignment_names_are_guid_of_scope_principal_role() -> None:
    for path in sorted(INFRA.rglob("*.bicep")):
        for resource in resources(path).values():
            if resource.type != ROLE_ASSIGNMENT:
                continue
            name, arguments = function(resource.body["name"]) or ("", {})
            assert name == "guid", resource.symbol
            scope, principal, role = (arguments["base_string"], arguments["extra_string_1"],
                                      arguments["extra_string_2"])
            assert scope == {"operator": {"type": "property_accessor", "operands": {
                "operand_1": resource.body["scope"], "operand_2": "id"}}}, resource.symbol
            assert principal == resource.body["properties"]["principalId"], resource.symbol
            reference = resource.body["properties"]["roleDefinitionId"]
            call = function(reference)
            expected = call[1]["resource_name_1"] if call is not None else reference
            assert role == expected, resource.symbol


# -- the names the scopes stand for -----------------------------------------------------------

def test_the_table_and_container_names_are_the_ones_the_code_uses() -> None:
    from bus.integrations.spark.staging import container_name, table_name
    from bus.naming import Names

    names = topology()
    prefix = names["prefix"]
    assert variable(RBAC, "tokensTableName") == "${topology.prefix}bustokens"
    assert variable(RBAC, "ledgerTableName") == "${topology.prefix}busledger"
    assert variable(RBAC, "instancesTableName") == "${topology.prefix}businstances"
    assert Names(prefix).instances_table == f"{prefix}businstances"
    assert Names(prefix).instances_table in names["tables"]
    assert {Names(prefix).tokens_table, Names(prefix).ledger_table} <= set(names["tables"])
    assert Names(prefix).tokens_table == f"{prefix}bustokens"
    assert Names(prefix).ledger_table == f"{prefix}busledger"
    # The Spark staging names, for the empty prefix and another one.
    assert variable(STORAGE, "sparkStagingTableName") == "${topology.prefix}busstaging"
    staging = variable(STORAGE, "sparkStagingContainerName")
    operands = staging["operator"]["operands"]
    assert staging["operator"]["type"] == "conditional"
    assert function(operands["condition"]) == ("empty", {"item_to_test": {
        "operator": {"type": "property_accessor", "operands": {
            "operand_1": "topology", "operand_2": "prefix"}}}})
    for p in ("", "shop1"):
        assert table_name(p) == f"{p}busstaging"
        assert container_name(p) == (operands["true_value"] if not p
                                     else operands["false_value"].replace(
                                         "${topology.prefix}", p))
    _, rbac = modules(MAIN)["rbac"]
    for param in ("payloadContainerName", "hostContainerNames", "durableContainerNames",
                  "sparkStagingTableName", "sparkStagingContainerName"):
        assert chain(rbac[param]) == ("storage", "outputs", param), param
    assert chain(parse(STORAGE)["outputs"]["payloadContainerName"]["value"]) == (
        "topology", "payloadContainer")
    # The scopes rbac.bicep names exist: storage.bicep declares each of them.
    declared = resources(STORAGE)
    assert variable(STORAGE, "hostContainerNames") == ["azure-webjobs-hosts",
                                                       "azure-webjobs-secrets"]
    for symbol, source in (("hostContainers", "hostContainerNames"),
                           ("durableContainers", "durableContainerNames"),
                           ("sparkQueues", "sparkReaderQueues"),
                           ("sparkPoisonQueues", "sparkReaderQueues")):
        assert declared[symbol].loop_source == (source,) and not declared[symbol].existing


def test_the_durable_containers_follow_the_hub_name_the_app_runs_with() -> None:
    hub = "${toLower(durableHubName)}"
    assert variable(STORAGE, "durableContainerNames") == [
        f"{hub}-leases", f"{hub}-applease", f"{hub}-largemessages"]
    # main.bicep derives the hub as function.bicep's default does, and passes the one value to
    # both modules.
    derived = variable(MAIN, "durableHubName")
    default = parse(FUNCTION)["parameters"]["durableHubName"]["default"]
    assert json.dumps(derived).replace("functionAppName", "name") == json.dumps(default)
    _, storage = modules(MAIN)["storage"]
    _, app = modules(MAIN)["functionApp"]
    assert storage["durableHubName"] == app["durableHubName"] == "durableHubName"


# -- storage diagnostic logs -----------------------------------------------------------------------

def test_diagnostic_logs_for_blob_queue_and_table_go_to_log_analytics() -> None:
    declared = resources(STORAGE)
    settings = {chain(r.body["scope"])[0]: r for r in declared.values()
                if r.type == "Microsoft.Insights/diagnosticSettings"}
    for service in ("blobServices", "queueServices", "tableServices"):
        symbol = next((s for s in settings
                       if declared[s].type == f"Microsoft.Storage/storageAccounts/{service}"),
                      None)
        assert symbol is not None, f"no diagnostic setting on the {service}"
        properties = settings[symbol].body["properties"]
        logs = properties["logs"]
        logs = variable(STORAGE, logs) if isinstance(logs, str) else logs
        assert {(entry["category"], entry["enabled"]) for entry in logs} >= {
            ("StorageRead", True), ("StorageWrite", True), ("StorageDelete", True)}, service
        metrics = properties["metrics"]
        metrics = variable(STORAGE, metrics) if isinstance(metrics, str) else metrics
        assert ("Transaction", True) in {(m["category"], m["enabled"]) for m in metrics}
        assert properties["workspaceId"] == "logAnalyticsWorkspaceId"
    _, storage = modules(MAIN)["storage"]
    assert chain(storage["logAnalyticsWorkspaceId"]) == ("monitoring", "outputs",
                                                         "logAnalyticsWorkspaceId")
