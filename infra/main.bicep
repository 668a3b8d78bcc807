// The whole app in one resource group: storage (queues, tables, containers and topic files of the
// bus, from topology.json), the Functions app on Flex Consumption with a managed identity and
// least-privilege roles (docs/deploy.md, "Roles"), Application Insights with Log Analytics, and
// the storage diagnostic logs.
//
//   python -m bus topology export          # after changing endpoints or subscriptions
//   az deployment group create -g <rg> -f infra/main.bicep -p infra/main.parameters.json
//
// Every module is a local file, so `make infra-check` checks every resource offline.

targetScope = 'resourceGroup'

@minLength(1)
@maxLength(64)
@description('Name of the environment (dev, test, prod): seeds the resource names and tags every resource.')
param environmentName string

@description('Region of every resource: one where the Flex Consumption plan is offered.')
param location string = resourceGroup().location

@description('Storage replication. Zone- or geo-redundant: the queues and tables hold the messages and the exactly-once state.')
@allowed(['Standard_ZRS', 'Standard_GRS', 'Standard_RAGRS', 'Standard_GZRS', 'Standard_RAGZRS'])
param storageSku string = 'Standard_GZRS'

@description('Flex Consumption: most instances the app scales out to (the plan accepts 40 to 1000).')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Flex Consumption: memory of each instance.')
@allowed([512, 2048, 4096])
param instanceMemoryMB int = 2048

@description('Flex Consumption: spread instances over availability zones (only in regions that offer it; bills at least two always-ready instances per scaling group).')
param zoneRedundant bool = false

@description('BUS_ENDPOINTS: comma-separated endpoints this app runs; empty for all of them.')
param busEndpoints string = ''

@description('BUS_INLINE_DISPATCH_MAX: fan-outs up to this size are dispatched inside the trigger.')
@minValue(0)
param inlineDispatchMax int = 4

@description('BUS_STALLED_OUTBOX_SECONDS: maintenance finishes outbox records older than this.')
@minValue(1)
param stalledOutboxSeconds int = 600
@description('BUS_DELIVERY_THREADS: threads for the queue triggers\' deliveries (32); 0 uses the event loop\'s default executor (docs/functions.md, "Threads").')
@minValue(0)
@maxValue(256)
param deliveryThreads int = 32

@description('Optional: object id of the operators (a user or group, or the dashboard\'s identity) running the poison-queue and sessions tools and the dashboard: poison queues, sends to and reads of the endpoint queues, the inbox tokens table, the state tables, the payload container - nothing else (docs/deploy.md, "Roles").')
param operatorPrincipalId string = ''

@description('Type of operatorPrincipalId.')
@allowed(['User', 'Group', 'ServicePrincipal'])
param operatorPrincipalType string = 'User'

@description('Optional: object id of a foreign producer (usually a service principal or managed identity) that sends commands into the bus: insert into the inbox tokens table, add messages to the endpoint queues, create claim-check blobs - a custom role with exactly those three data actions. Creating the custom role needs Owner or User Access Administrator on the resource group.')
param producerPrincipalId string = ''

@description('Type of producerPrincipalId.')
@allowed(['User', 'Group', 'ServicePrincipal'])
param producerPrincipalType string = 'ServicePrincipal'

@description('Optional: object id of the Spark jobs\' identity: send through the send ledger, read the reader endpoints in sparkReaderQueues, stage in the staging table and container. Needs Owner or User Access Administrator on the resource group (a custom create-if-missing role for Bus.provision()).')
param sparkPrincipalId string = ''

@description('Type of sparkPrincipalId.')
@allowed(['User', 'Group', 'ServicePrincipal'])
param sparkPrincipalType string = 'ServicePrincipal'

@description('Queue names of Spark reader endpoints the app does not declare (`python -c "from bus.naming import Names; print(Names(\'<prefix>\').queue(\'analytics\'))"`); those it declares (BusFunctions(readers=...)) come from topology.json. Each gets its queue and poison queue, and only the Spark principal gets data roles on them.')
param sparkReaderQueues array = []

@description('Optional: object id of the user, group or pipeline that runs `func azure functionapp publish`: gets Website Contributor on the Function App (the publish goes through its SCM endpoint) and no storage role - the platform writes the package with the deployment identity.')
param publisherPrincipalId string = ''

@description('Type of publisherPrincipalId.')
@allowed(['User', 'Group', 'ServicePrincipal'])
param publisherPrincipalType string = 'User'

@description('Optional: an e-mail address told when a bus alert fires and when it resolves (docs/operating.md, "Alerts").')
param alertEmail string = ''
@secure()
@description('Optional: a webhook (Teams, Slack, an incident tool) Azure Monitor calls when a bus alert fires and when it resolves.')
param alertWebhookUrl string = ''

var abbrs = loadJsonContent('abbreviations.json')
var topology = loadJsonContent('topology.json')
// The reader endpoints the app declares (their subscriptions are in the topic files) and any
// others given as a parameter.
var declaredReaderQueues = [for reader in topology.readers: reader.queue]
var readerQueues = union(declaredReaderQueues, sparkReaderQueues)
var resourceToken = toLower(uniqueString(subscription().id, resourceGroup().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
  app: 'eobus'
}
var functionAppName = '${abbrs.webSitesFunctions}${resourceToken}'
// BUS_DURABLE_HUB (app/function.bicep): the same derivation as that module's default; computed
// here too because storage.bicep declares the hub's containers, named after it.
var durableHubName = take('hub${replace(functionAppName, '-', '')}', 45)

resource appIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${abbrs.managedIdentityUserAssignedIdentities}app-${resourceToken}'
  location: location
  tags: tags
}

// The deployment identity: the only principal that can write the app-package container. The Flex
// Consumption platform uploads the package with it on a publish and instances read it with it;
// the app's code runs as appIdentity, which has no role on that container.
resource deployIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${abbrs.managedIdentityUserAssignedIdentities}deploy-${resourceToken}'
  location: location
  tags: tags
}

resource topicsIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${abbrs.managedIdentityUserAssignedIdentities}topics-${resourceToken}'
  location: location
  tags: tags
}

module monitoring 'app/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    logAnalyticsName: '${abbrs.operationalInsightsWorkspaces}${resourceToken}'
    applicationInsightsName: '${abbrs.insightsComponents}${resourceToken}'
    location: location
    tags: tags
  }
}

// Azure Monitor alert rules on the conditions each maintenance pass checks (bus/hosting/alerts.py).
module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  params: {
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    location: location
    tags: tags
    resourceToken: resourceToken
    alertEmail: alertEmail
    alertWebhookUrl: alertWebhookUrl
  }
}

module storage 'app/storage.bicep' = {
  name: 'storage'
  params: {
    name: '${abbrs.storageStorageAccounts}${resourceToken}'
    location: location
    tags: tags
    skuName: storageSku
    deploymentContainerName: 'app-package-${resourceToken}'
    durableHubName: durableHubName
    sparkReaderQueues: readerQueues
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
  }
}

module rbac 'app/rbac.bicep' = {
  name: 'rbac'
  params: {
    storageAccountName: storage.outputs.name
    topicContainerName: storage.outputs.topicContainerName
    payloadContainerName: storage.outputs.payloadContainerName
    deploymentContainerName: storage.outputs.deploymentContainerName
    hostContainerNames: storage.outputs.hostContainerNames
    durableContainerNames: storage.outputs.durableContainerNames
    sparkStagingTableName: storage.outputs.sparkStagingTableName
    sparkStagingContainerName: storage.outputs.sparkStagingContainerName
    sparkReaderQueues: readerQueues
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    appPrincipalId: appIdentity.properties.principalId
    deployPrincipalId: deployIdentity.properties.principalId
    topicsPrincipalId: topicsIdentity.properties.principalId
    producerPrincipalId: producerPrincipalId
    producerPrincipalType: producerPrincipalType
    sparkPrincipalId: sparkPrincipalId
    sparkPrincipalType: sparkPrincipalType
    operatorPrincipalId: operatorPrincipalId
    operatorPrincipalType: operatorPrincipalType
  }
}

module functionApp 'app/function.bicep' = {
  name: 'functionApp'
  params: {
    name: functionAppName
    planName: '${abbrs.webServerFarms}${resourceToken}'
    location: location
    tags: union(tags, { 'azd-service-name': 'bus' })
    identityId: appIdentity.id
    identityClientId: appIdentity.properties.clientId
    deploymentIdentityId: deployIdentity.id
    storageAccountName: storage.outputs.name
    deploymentContainerName: storage.outputs.deploymentContainerName
    applicationInsightsConnectionString: monitoring.outputs.connectionString
    busPrefix: topology.prefix
    durableHubName: durableHubName
    busEndpoints: busEndpoints
    inlineDispatchMax: inlineDispatchMax
    stalledOutboxSeconds: stalledOutboxSeconds
    deliveryThreads: deliveryThreads
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    zoneRedundant: zoneRedundant
  }
  // Start the app once its identity holds its roles.
  dependsOn: [rbac]
}

// Whoever runs `func azure functionapp publish`: rights on the app (its SCM endpoint), none on
// storage. After the app exists, so in a module of its own.
module publisher 'app/publisher.bicep' = if (!empty(publisherPrincipalId)) {
  name: 'publisher'
  params: {
    functionAppName: functionApp.outputs.name
    publisherPrincipalId: publisherPrincipalId
    publisherPrincipalType: publisherPrincipalType
  }
}

module topics 'app/topics.bicep' = {
  name: 'topics'
  params: {
    name: '${abbrs.resourcesDeploymentScripts}topics-${resourceToken}'
    location: location
    tags: tags
    identityId: topicsIdentity.id
    storageAccountName: storage.outputs.name
  }
  dependsOn: [rbac]
}

output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = resourceGroup().name
output AZURE_STORAGE_ACCOUNT_NAME string = storage.outputs.name
output AZURE_STORAGE_BLOB_ENDPOINT string = storage.outputs.blobEndpoint
output AZURE_STORAGE_QUEUE_ENDPOINT string = storage.outputs.queueEndpoint
output AZURE_STORAGE_TABLE_ENDPOINT string = storage.outputs.tableEndpoint
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output AZURE_FUNCTION_APP_CLIENT_ID string = appIdentity.properties.clientId
output AZURE_DEPLOY_IDENTITY_CLIENT_ID string = deployIdentity.properties.clientId
output APPLICATIONINSIGHTS_CONNECTION_STRING string = monitoring.outputs.connectionString
output BUS_PREFIX string = topology.prefix
output BUS_DURABLE_HUB string = functionApp.outputs.durableHubName
output BUS_TOPIC_COUNT int = topics.outputs.topicCount
