// Every role assignment of the deployment, least privilege, each scoped as narrowly as its use.
// Assignment names are guid(scope, principal, role): stable across deployments, unique per triple.

@description('Storage account of the bus.')
param storageAccountName string
@description('Container of the topic files: the only place the topic-file script may write.')
param topicContainerName string
@description('Application Insights component the app sends telemetry to.')
param applicationInsightsName string
@description('Principal id of the Function App\'s managed identity.')
param appPrincipalId string
@description('Principal id of the identity that runs the topic-file deployment script.')
param topicsPrincipalId string
@description('Optional: a user, group or service principal that runs the local tools or Spark jobs against the bus.')
param operatorPrincipalId string = ''
@allowed(['User', 'Group', 'ServicePrincipal'])
param operatorPrincipalType string = 'User'

// Built-in role definition ids (the same in every tenant).
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88' // Storage Queue Data Contributor: create queues; send, receive, update, delete messages
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b' // Storage Blob Data Owner: the Functions host manages its containers and blob leases
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor: create tables; read and write entities (tokens, outbox, state; Durable history)
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor: read, write, delete blobs (no ACL or lease management)
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb' // Monitoring Metrics Publisher: send telemetry with Entra ID to Application Insights

// The app: the data roles the bus and the Functions host (AzureWebJobsStorage, Durable task hub) need.
var appStorageRoles = [storageQueueDataContributor, storageBlobDataOwner, storageTableDataContributor]
// Operators (when one is given): the same data, without the host's blob ownership.
var operatorStorageRoles = empty(operatorPrincipalId) ? [] : [storageQueueDataContributor, storageBlobDataContributor, storageTableDataContributor]

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource topicContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: topicContainerName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource appStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in appStorageRoles: {
  name: guid(storage.id, appPrincipalId, role)
  scope: storage
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
  }
}]

resource appTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, appPrincipalId, monitoringMetricsPublisher)
  scope: applicationInsights
  properties: {
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
  }
}

resource topicsWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topicContainer.id, topicsPrincipalId, storageBlobDataContributor)
  scope: topicContainer
  properties: {
    principalId: topicsPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}

resource operatorStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in operatorStorageRoles: {
  name: guid(storage.id, operatorPrincipalId, role)
  scope: storage
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
  }
}]
