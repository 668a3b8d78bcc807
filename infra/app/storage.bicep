// The storage account of the bus and of the Functions host, with every queue, table and
// container the bus needs - read from topology.json, which the app generates
// (`python -m bus topology export`), so the names are the ones the code computes - and the
// containers of the Functions host and of the Durable task hub, declared here so that the app's
// blob roles can be scoped to them (rbac.bicep); and the diagnostic logs of the blob, queue and
// table services.

@description('Storage account name (3-24 lower-case letters and digits).')
param name string
param location string
param tags object
@description('Replication. Zone- or geo-redundant: the queues and tables hold the messages and the exactly-once state.')
@allowed(['Standard_ZRS', 'Standard_GRS', 'Standard_RAGRS', 'Standard_GZRS', 'Standard_RAGZRS'])
param skuName string = 'Standard_GZRS'
@description('Blob container the Flex Consumption plan deploys the app package from.')
param deploymentContainerName string
@description('The app\'s Durable task hub (BUS_DURABLE_HUB): its blob containers are named after it, lower-cased.')
param durableHubName string
@description('Queue names of the Spark reader endpoints (bus.naming: the endpoint lower-cased, runs of other characters than a-z0-9 as one \'-\', behind \'<prefix>-\'). Each gets its queue and its poison queue here, so that the Spark principal\'s roles can be scoped to them.')
param sparkReaderQueues array = []
@description('Log Analytics workspace that receives the storage diagnostic logs (StorageRead, StorageWrite, StorageDelete) and metrics.')
param logAnalyticsWorkspaceId string

var topology = loadJsonContent('../topology.json')
// The Functions host's containers with an identity-based AzureWebJobsStorage: locks, timers and
// host ids; the key store (secrets). The host creates them if missing; created here, so the app's
// Blob Data Owner is scoped to them instead of the account.
var hostContainerNames = ['azure-webjobs-hosts', 'azure-webjobs-secrets']
// The Durable task hub's containers (Azure Storage provider): partition leases, the app lease,
// messages too large for a queue. Container names are lower-case.
var durableContainerNames = ['${toLower(durableHubName)}-leases', '${toLower(durableHubName)}-applease', '${toLower(durableHubName)}-largemessages']
// The Spark integration's staging table and container (bus/integrations/spark/staging.py:
// table_name, container_name). Not in topology.json: Bus.provision() does not create them.
var sparkStagingTableName = '${topology.prefix}busstaging'
var sparkStagingContainerName = empty(topology.prefix) ? 'bus-staging' : '${topology.prefix}-bus-staging'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_59: public endpoint on purpose - the bus's producers and operators (Spark jobs, the CLI) connect from outside Azure, and Flex Consumption publishes its package through the platform; every request needs Entra ID (shared keys are off)
  // checkov:skip=CKV_AZURE_35: default action Allow on purpose - no VNet or private endpoints in this template, so Deny would lock out the Flex Consumption deployment and the bus's clients outside Azure (all of them need Entra ID)
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    supportsHttpsTrafficOnly: true
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    // Entra ID only: no account keys, no SAS signed with them.
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowCrossTenantReplication: false
    // The bus's producers and operators (Spark jobs, the CLI) reach the account from outside
    // Azure, authenticated with Entra ID; see the checkov skips above and docs/deploy.md.
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: { enabled: true, keyType: 'Account' }
        file: { enabled: true, keyType: 'Account' }
        queue: { enabled: true, keyType: 'Account' }
        table: { enabled: true, keyType: 'Account' }
      }
    }
  }
}

// The services are top-level resources with a parent (not nested blocks), so that every one of
// them is visible to the offline checks (the Bicep parser keeps one nested child per resource).
resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

// One queue and one poison queue per endpoint.
resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for endpoint in topology.endpoints: {
  parent: queueService
  name: endpoint.queue
}]

resource poisonQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for endpoint in topology.endpoints: {
  parent: queueService
  name: endpoint.poisonQueue
}]

// One state table (partitions: inbox tokens of the partition, outbox slot, state rows) per
// endpoint, and the bus-wide tables (inbox tokens, send ledger).
resource stateTables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for endpoint in topology.endpoints: {
  parent: tableService
  name: endpoint.stateTable
}]

resource busTables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for table in topology.tables: {
  parent: tableService
  name: table
}]

// Claim-check payloads and topic recipient lists; and the app package.
resource busContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for container in topology.containers: {
  parent: blobService
  name: container
  properties: {
    publicAccess: 'None'
  }
}]

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for container in hostContainerNames: {
  parent: blobService
  name: container
  properties: {
    publicAccess: 'None'
  }
}]

resource durableContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for container in durableContainerNames: {
  parent: blobService
  name: container
  properties: {
    publicAccess: 'None'
  }
}]

// The Spark jobs' staging (rows between "done by a task" and "made visible") and reader endpoints.
resource sparkStagingTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: sparkStagingTableName
}

resource sparkStagingContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: sparkStagingContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource sparkQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for queue in sparkReaderQueues: {
  parent: queueService
  name: queue
}]

resource sparkPoisonQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for queue in sparkReaderQueues: {
  parent: queueService
  name: '${queue}-poison'
}]

// Diagnostic logs: every read, write and delete on blobs, queues and tables goes to Log
// Analytics (StorageBlobLogs, StorageQueueLogs, StorageTableLogs), with the services' transaction
// metrics; the account itself has metrics only.
var storageLogs = [
  { category: 'StorageRead', enabled: true }
  { category: 'StorageWrite', enabled: true }
  { category: 'StorageDelete', enabled: true }
]
var storageMetrics = [
  { category: 'Transaction', enabled: true }
]

resource accountDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'storage-to-log-analytics'
  scope: storage
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    metrics: storageMetrics
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'blob-to-log-analytics'
  scope: blobService
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: storageLogs
    metrics: storageMetrics
  }
}

resource queueDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'queue-to-log-analytics'
  scope: queueService
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: storageLogs
    metrics: storageMetrics
  }
}

resource tableDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'table-to-log-analytics'
  scope: tableService
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: storageLogs
    metrics: storageMetrics
  }
}

output name string = storage.name
output id string = storage.id
output blobEndpoint string = storage.properties.primaryEndpoints.blob
output queueEndpoint string = storage.properties.primaryEndpoints.queue
output tableEndpoint string = storage.properties.primaryEndpoints.table
output topicContainerName string = topology.topicContainer
output deploymentContainerName string = deploymentContainer.name
output payloadContainerName string = topology.payloadContainer
output hostContainerNames array = hostContainerNames
output durableContainerNames array = durableContainerNames
output sparkStagingTableName string = sparkStagingTable.name
output sparkStagingContainerName string = sparkStagingContainer.name
