// Every role assignment of the deployment, least privilege, each scoped to the queues, tables and
// containers its principal uses (docs/deploy.md, "Roles"). Assignment names are
// guid(scope, principal, role): stable across deployments, unique per triple.
//
// Only two data-plane assignments are account-wide, both the app's, both because the Functions
// host creates queues and tables whose names are not known here (the Durable task hub's
// `<hub>-control-NN` and `<hub>-workitems` queues and `<hub>Instances`/`<hub>History` tables;
// the host's diagnostic-events tables, one per month). The tests keep an explicit allow-list of
// them (tests/infra/test_roles.py). Nobody holds a blob role on the account: the app-package
// container is writable by the deployment identity alone.

@description('Storage account of the bus.')
param storageAccountName string
@description('Container of the topic files: the only place the topic-file script may write.')
param topicContainerName string
@description('Container of the claim-check payloads (and of poison entries too large for a queue message).')
param payloadContainerName string
@description('Container the Flex Consumption plan deploys the app package from: only the deployment identity may write it.')
param deploymentContainerName string
@description('The Functions host\'s containers (azure-webjobs-hosts, azure-webjobs-secrets), declared in storage.bicep.')
param hostContainerNames array
@description('The Durable task hub\'s containers (leases, app lease, large messages), declared in storage.bicep.')
param durableContainerNames array
@description('The Spark integration\'s staging table.')
param sparkStagingTableName string
@description('The Spark integration\'s staging container.')
param sparkStagingContainerName string
@description('Queue names of the Spark reader endpoints (each with its `-poison` queue), declared in storage.bicep.')
param sparkReaderQueues array = []
@description('Application Insights component the app sends telemetry to.')
param applicationInsightsName string
@description('Principal id of the Function App\'s runtime identity (AzureWebJobsStorage, the bus, telemetry).')
param appPrincipalId string
@description('Principal id of the deployment identity: the identity the Flex Consumption platform writes and reads the app package with (functionAppConfig.deployment.storage.authentication).')
param deployPrincipalId string
@description('Principal id of the identity that runs the topic-file deployment script.')
param topicsPrincipalId string
@description('Optional: a foreign producer (user, group or service principal) that sends commands into the bus: token inserts, queue sends, new claim-check blobs - nothing else.')
param producerPrincipalId string = ''
@allowed(['User', 'Group', 'ServicePrincipal'])
param producerPrincipalType string = 'ServicePrincipal'
@description('Optional: the Spark jobs\' principal: sends through the send ledger, reads its reader endpoints\' queues, stages in its own table and container.')
param sparkPrincipalId string = ''
@allowed(['User', 'Group', 'ServicePrincipal'])
param sparkPrincipalType string = 'ServicePrincipal'
@description('Optional: operators (user or group, or the dashboard\'s identity) running the poison-queue and sessions tools and the dashboard: poison queues, endpoint queues (send, read), inbox tokens, state tables, claim checks.')
param operatorPrincipalId string = ''
@allowed(['User', 'Group', 'ServicePrincipal'])
param operatorPrincipalType string = 'User'

var topology = loadJsonContent('../topology.json')
// bus/naming.py: Names.tokens_table, Names.ledger_table (both listed in topology.tables).
var tokensTableName = '${topology.prefix}bustokens'
var auditTableName = '${topology.prefix}busaudit' // bus/naming.py: Names.audit_table
var instancesTableName = '${topology.prefix}businstances' // bus/naming.py: Names.instances_table
var ledgerTableName = '${topology.prefix}busledger'
var hasProducer = !empty(producerPrincipalId)
var hasSpark = !empty(sparkPrincipalId)
var hasOperator = !empty(operatorPrincipalId)

// Built-in role definition ids (the same in every tenant).
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88' // Storage Queue Data Contributor: create queues; send, receive, update, delete messages
var storageQueueDataMessageSender = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a' // Storage Queue Data Message Sender: add messages, nothing else
var storageQueueDataReader = '19e7f393-937e-4f77-808e-94535e297925' // Storage Queue Data Reader: queue properties (depth) and peek, nothing else
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b' // Storage Blob Data Owner: the Functions host's containers (Microsoft lists Owner for host storage)
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor: read, write, delete blobs (no ACL or ownership)
var storageBlobDataReader = '2a2b9908-6ea1-4ae2-8e65-a410df84e7d1' // Storage Blob Data Reader: read and list blobs
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor: create tables; read, insert, update, delete entities
var storageTableDataReader = '76199698-9eea-4c19-bc75-cec21354c6b6' // Storage Table Data Reader: read entities, nothing else
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb' // Monitoring Metrics Publisher: send telemetry with Entra ID to Application Insights

// Custom roles. Creating a role definition needs Microsoft.Authorization/roleDefinitions/write
// (Owner or User Access Administrator on the resource group), so each is created only when a
// principal that needs it is given. Role names are unique per tenant: they carry the account.

// A foreign producer: insert a token, send a signal, write a new claim-check blob. No read, no
// update, no delete: it cannot touch a token, message or blob that exists. (Insert Entity needs
// entities/add/action; Put Message messages/add/action; Put Blob of a new blob blobs/add/action:
// https://learn.microsoft.com/rest/api/storageservices/authorize-with-azure-active-directory)
var producerDataActions = [
  'Microsoft.Storage/storageAccounts/tableServices/tables/entities/add/action'
  'Microsoft.Storage/storageAccounts/queueServices/queues/messages/add/action'
  'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action'
]

resource producerRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = if (hasProducer) {
  name: guid(resourceGroup().id, storageAccountName, 'eobus-producer')
  properties: {
    roleName: 'eobus producer (${storageAccountName})'
    description: 'Sends commands into the bus: inserts inbox tokens, adds queue messages, creates claim-check blobs. Assigned on the tokens table, the endpoint queues and the payload container only.'
    type: 'CustomRole'
    permissions: [
      {
        actions: []
        notActions: []
        dataActions: producerDataActions
        notDataActions: []
      }
    ]
    assignableScopes: [resourceGroup().id]
  }
}

// Bus.provision() - which the Spark integration runs before every job (writer.prepare,
// reader.subscribe) - creates every queue, table and container of the bus if missing. Create
// Queue, Create Table and Create Container are authorized by these (non-data) actions, also when
// the resource exists; they grant no data access.
var provisionerActions = [
  'Microsoft.Storage/storageAccounts/queueServices/queues/write'
  'Microsoft.Storage/storageAccounts/tableServices/tables/write'
  'Microsoft.Storage/storageAccounts/blobServices/containers/write'
]

resource provisionerRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = if (hasSpark) {
  name: guid(resourceGroup().id, storageAccountName, 'eobus-provisioner')
  properties: {
    roleName: 'eobus provisioner (${storageAccountName})'
    description: 'Create-if-missing on the bus\'s queues, tables and containers (Bus.provision()), without data access. Assigned on each of them, never on the account.'
    type: 'CustomRole'
    permissions: [
      {
        actions: provisionerActions
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
    assignableScopes: [resourceGroup().id]
  }
}

// -- the scopes -----------------------------------------------------------------------------

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource topicContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: topicContainerName
}

resource payloadContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: payloadContainerName
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: deploymentContainerName
}

resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = [for container in hostContainerNames: {
  parent: blobService
  name: container
}]

resource durableContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = [for container in durableContainerNames: {
  parent: blobService
  name: container
}]

resource tokensTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: tokensTableName
}

resource auditTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: auditTableName
}

resource instancesTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: instancesTableName
}

resource stateTables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = [for endpoint in topology.endpoints: {
  parent: tableService
  name: endpoint.stateTable
}]

resource endpointQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for endpoint in topology.endpoints: {
  parent: queueService
  name: endpoint.queue
}]

resource poisonQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for endpoint in topology.endpoints: {
  parent: queueService
  name: endpoint.poisonQueue
}]

resource sparkQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for queue in sparkReaderQueues: {
  parent: queueService
  name: queue
}]

resource sparkPoisonQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for queue in sparkReaderQueues: {
  parent: queueService
  name: '${queue}-poison'
}]

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

// -- the app (runtime identity) ---------------------------------------------------------------

// Account-wide (allow-listed): the Durable task hub creates its control and work-item queues at
// start-up, named after the hub and its partition count; the bus's endpoint and poison queues.
resource appQueues 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, storageQueueDataContributor)
  scope: storage
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributor)
  }
}

// Account-wide (allow-listed): the Durable task hub's Instances/History tables, created at
// start-up, and the host's diagnostic-events tables (a new one each month); the bus's tables.
resource appTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, storageTableDataContributor)
  scope: storage
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
  }
}

// The host's own containers: Microsoft lists Storage Blob Data Owner for host storage.
resource appHostBlobs 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (container, i) in hostContainerNames: {
  name: guid(hostContainers[i].id, appPrincipalId, storageBlobDataOwner)
  scope: hostContainers[i]
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwner)
  }
}]

// The Durable task hub's containers: Microsoft lists Storage Blob Data Contributor for Durable.
resource appDurableBlobs 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (container, i) in durableContainerNames: {
  name: guid(durableContainers[i].id, appPrincipalId, storageBlobDataContributor)
  scope: durableContainers[i]
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}]

// Claim checks (written, read, deleted) and large poison entries.
resource appPayloads 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(payloadContainer.id, appPrincipalId, storageBlobDataContributor)
  scope: payloadContainer
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}

// Topic files: the app reads recipient lists to publish; the deployment writes them.
resource appTopics 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topicContainer.id, appPrincipalId, storageBlobDataReader)
  scope: topicContainer
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataReader)
  }
}

resource appTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, appPrincipalId, monitoringMetricsPublisher)
  scope: applicationInsights
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
  }
}

// -- the deployment identity: the only writer of the app package ------------------------------

// `func azure functionapp publish` sends the package to the app's SCM endpoint; the platform
// uploads it into this container with the identity of functionAppConfig.deployment.storage
// (this one), and instances read it from there with the same identity.
resource deployPackage 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deploymentContainer.id, deployPrincipalId, storageBlobDataContributor)
  scope: deploymentContainer
  properties: {
    principalId: deployPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}

// -- the topic-file script ------------------------------------------------------------------------

resource topicsWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topicContainer.id, topicsPrincipalId, storageBlobDataContributor)
  scope: topicContainer
  properties: {
    principalId: topicsPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}

// -- a foreign producer (optional) --------------------------------------------------------------

resource producerTokens 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasProducer) {
  name: guid(tokensTable.id, producerPrincipalId, producerRole.id)
  scope: tokensTable
  properties: {
    principalId: producerPrincipalId
    principalType: producerPrincipalType
    roleDefinitionId: producerRole.id
  }
}

resource producerQueues 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasProducer) {
  name: guid(endpointQueues[i].id, producerPrincipalId, producerRole.id)
  scope: endpointQueues[i]
  properties: {
    principalId: producerPrincipalId
    principalType: producerPrincipalType
    roleDefinitionId: producerRole.id
  }
}]

resource producerPayloads 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasProducer) {
  name: guid(payloadContainer.id, producerPrincipalId, producerRole.id)
  scope: payloadContainer
  properties: {
    principalId: producerPrincipalId
    principalType: producerPrincipalType
    roleDefinitionId: producerRole.id
  }
}

// -- the Spark jobs (optional) ------------------------------------------------------------------

// Sending through the send ledger: ledger records, inbox tokens (insert, fence; and, reading,
// check, consume, poison); the staging rows; a streaming read's heartbeat (bus/hosting/heartbeat.py).
var sparkTableNames = [tokensTableName, ledgerTableName, sparkStagingTableName, instancesTableName]

resource sparkTables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = [for table in sparkTableNames: {
  parent: tableService
  name: table
}]

resource sparkTableData 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (table, i) in sparkTableNames: if (hasSpark) {
  name: guid(sparkTables[i].id, sparkPrincipalId, storageTableDataContributor)
  scope: sparkTables[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
  }
}]

// Claim checks (write when sending; read and delete when reading) and staged large values.
var sparkContainerNames = [payloadContainerName, sparkStagingContainerName]

resource sparkContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = [for container in sparkContainerNames: {
  parent: blobService
  name: container
}]

resource sparkBlobData 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (container, i) in sparkContainerNames: if (hasSpark) {
  name: guid(sparkContainers[i].id, sparkPrincipalId, storageBlobDataContributor)
  scope: sparkContainers[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}]

// Topic files: read (Bus.provision() checks each subscription). Not written: the deployment owns
// them (topics.sh rewrites them from topology.json every time).
resource sparkTopics 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasSpark) {
  name: guid(topicContainer.id, sparkPrincipalId, storageBlobDataReader)
  scope: topicContainer
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataReader)
  }
}

// Signals to the app's endpoints: send only.
resource sparkSends 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasSpark) {
  name: guid(endpointQueues[i].id, sparkPrincipalId, storageQueueDataMessageSender)
  scope: endpointQueues[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageSender)
  }
}]

// Its own reader endpoints: receive, settle, poison.
resource sparkReaderQueueData 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (queue, i) in sparkReaderQueues: if (hasSpark) {
  name: guid(sparkQueues[i].id, sparkPrincipalId, storageQueueDataContributor)
  scope: sparkQueues[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributor)
  }
}]

resource sparkReaderPoisonData 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (queue, i) in sparkReaderQueues: if (hasSpark) {
  name: guid(sparkPoisonQueues[i].id, sparkPrincipalId, storageQueueDataContributor)
  scope: sparkPoisonQueues[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributor)
  }
}]

// Bus.provision()'s create-if-missing on what the Spark principal has no data role on.
resource sparkProvisionQueues 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasSpark) {
  name: guid(endpointQueues[i].id, sparkPrincipalId, provisionerRole.id)
  scope: endpointQueues[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: provisionerRole.id
  }
}]

resource sparkProvisionPoisonQueues 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasSpark) {
  name: guid(poisonQueues[i].id, sparkPrincipalId, provisionerRole.id)
  scope: poisonQueues[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: provisionerRole.id
  }
}]

resource sparkProvisionStateTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasSpark) {
  name: guid(stateTables[i].id, sparkPrincipalId, provisionerRole.id)
  scope: stateTables[i]
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: provisionerRole.id
  }
}]

resource sparkProvisionTopics 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasSpark) {
  name: guid(topicContainer.id, sparkPrincipalId, provisionerRole.id)
  scope: topicContainer
  properties: {
    principalId: sparkPrincipalId
    principalType: sparkPrincipalType
    roleDefinitionId: provisionerRole.id
  }
}

// -- operators (optional): the poison-queue and sessions tools, the dashboard -------------------

// List, adopt, replay and purge poison entries.
resource operatorPoison 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasOperator) {
  name: guid(poisonQueues[i].id, operatorPrincipalId, storageQueueDataContributor)
  scope: poisonQueues[i]
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributor)
  }
}]

// A replay sends the entry's signal to its endpoint's queue: send only.
resource operatorReplay 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasOperator) {
  name: guid(endpointQueues[i].id, operatorPrincipalId, storageQueueDataMessageSender)
  scope: endpointQueues[i]
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageSender)
  }
}]

// Poisoned tokens: read, revive (replay), delete (purge).
resource operatorTokens 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasOperator) {
  name: guid(tokensTable.id, operatorPrincipalId, storageTableDataContributor)
  scope: tokensTable
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
  }
}

// Poison entries kept in blobs (read), claim checks of purged entries (delete).
resource operatorPayloads 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasOperator) {
  name: guid(payloadContainer.id, operatorPrincipalId, storageBlobDataContributor)
  scope: payloadContainer
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}

// The dashboard's and the sessions tools' share (docs/dashboard.md, "Running it"): pause and
// resume rows, sessions (list, skip, close), the record a purge completes first - the state
// tables; each queue's depth and oldest message on the overview - the endpoint queues, read.
resource operatorStateTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasOperator) {
  name: guid(stateTables[i].id, operatorPrincipalId, storageTableDataContributor)
  scope: stateTables[i]
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
  }
}]

resource operatorQueueReads 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (endpoint, i) in topology.endpoints: if (hasOperator) {
  name: guid(endpointQueues[i].id, operatorPrincipalId, storageQueueDataReader)
  scope: endpointQueues[i]
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataReader)
  }
}]

// The audit trail (bus/audit.py): every action above writes its record first; the dashboard
// and `python -m bus audit` read it.
resource operatorAudit 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasOperator) {
  name: guid(auditTable.id, operatorPrincipalId, storageTableDataContributor)
  scope: auditTable
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
  }
}

// Which processes serve each endpoint (bus/hosting/heartbeat.py): the dashboard's Endpoints page
// and `python -m bus status` read the heartbeats; only the hosts write them.
resource operatorInstances 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasOperator) {
  name: guid(instancesTable.id, operatorPrincipalId, storageTableDataReader)
  scope: instancesTable
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataReader)
  }
}
