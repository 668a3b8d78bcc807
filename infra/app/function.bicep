// The Functions app: Linux, Flex Consumption plan, Python 3.13, two user-assigned identities: the
// app's (host storage, the bus's storage, telemetry; AzureWebJobsStorage__clientId and
// AZURE_CLIENT_ID pick it) and the deployment identity, used only for the app-package container
// (functionAppConfig.deployment.storage). No keys or connection strings to storage anywhere.

param name string
param planName string
param location string
param tags object
@description('Resource id of the user-assigned identity the app runs as.')
param identityId string
@description('Client id of that identity (picks it for AzureWebJobsStorage and DefaultAzureCredential).')
param identityClientId string
@description('Resource id of the deployment identity: the platform writes and reads the app package with it; the only principal with write access to the package container.')
param deploymentIdentityId string
param storageAccountName string
param deploymentContainerName string
param applicationInsightsConnectionString string
@description('BUS_PREFIX: resource-name prefix of the bus (recorded in topology.json).')
param busPrefix string
@description('BUS_ENDPOINTS: comma-separated endpoints this app runs; empty for all.')
param busEndpoints string = ''
@description('BUS_INLINE_DISPATCH_MAX: fan-outs up to this size are dispatched inside the trigger.')
param inlineDispatchMax int = 4
@description('BUS_STALLED_OUTBOX_SECONDS: maintenance finishes outbox records older than this.')
param stalledOutboxSeconds int = 600
@description('BUS_DELIVERY_THREADS: threads for the queue triggers\' deliveries (32); 0 uses the event loop\'s default executor (docs/functions.md, "Threads").')
@minValue(0)
@maxValue(256)
param deliveryThreads int = 32
@description('Most instances the app scales out to. Flex Consumption accepts 40 to 1000.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100
@allowed([512, 2048, 4096])
param instanceMemoryMB int = 2048
@description('Spread instances over availability zones. Only in regions that offer it for Flex Consumption; keeps at least two always-ready (billed) instances per scaling group.')
param zoneRedundant bool = false
// Task hub names: 3-45 characters, letters and digits only, starting with a letter. App names are
// letters, digits and '-': without the hyphens, behind a letter prefix, cut to 45 characters.
@description('BUS_DURABLE_HUB: the Durable task hub (host.json hubName is %BUS_DURABLE_HUB%). One per app: apps that share a storage account must not share a hub.')
@minLength(3)
@maxLength(45)
param durableHubName string = take('hub${replace(name, '-', '')}', 45)

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  // checkov:skip=CKV_AZURE_225: zone redundancy is the zoneRedundant parameter - off by default because Flex Consumption offers it only in some regions (the deployment fails elsewhere) and it bills always-ready instances
  properties: {
    reserved: true // Linux
    zoneRedundant: zoneRedundant
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: tags
  kind: 'functionapp,linux'
  // checkov:skip=CKV_AZURE_222: the app serves no HTTP functions, but `func azure functionapp publish` deploys through its SCM endpoint, which public network access 'Disabled' closes too (no VNet or private endpoint here)
  // checkov:skip=CKV_AZURE_212: numberOfWorkers does not apply to Flex Consumption: instances scale per function from the queue lengths (functionAppConfig.scaleAndConcurrency)
  // checkov:skip=CKV_AZURE_213: Flex Consumption does not support the platform health check, and the app has no HTTP endpoint to probe; failures show in Application Insights and the poison queues
  // checkov:skip=CKV_AZURE_17: Flex Consumption does not support certificate features, incoming client certificates included (clientCertEnabled); the app serves no HTTP functions
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
      '${deploymentIdentityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // No clientCertEnabled/clientCertMode: Flex Consumption does not support certificate features.
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      appSettings: [
        // The host's storage (triggers, Durable task hub, timers) and the bus's: the same
        // account, reached with the managed identity.
        { name: 'AzureWebJobsStorage__accountName', value: storage.name }
        { name: 'AzureWebJobsStorage__credential', value: 'managedidentity' }
        { name: 'AzureWebJobsStorage__clientId', value: identityClientId }
        // DefaultAzureCredential (the bus's storage clients) picks the user-assigned identity by it.
        { name: 'AZURE_CLIENT_ID', value: identityClientId }
        { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: applicationInsightsConnectionString }
        { name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING', value: 'ClientId=${identityClientId};Authorization=AAD' }
        // host.json telemetryMode is OpenTelemetry: the Python worker calls the Azure Monitor
        // distro's configure_azure_monitor() itself, before it imports function_app.py
        // (azure-functions-runtime otel.initialize_azure_monitor), so the app's spans, metrics
        // and logs reach Application Insights correlated with the host's.
        { name: 'PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY', value: 'true' }
        { name: 'BUS_PREFIX', value: busPrefix }
        { name: 'BUS_ENDPOINTS', value: busEndpoints }
        { name: 'BUS_INLINE_DISPATCH_MAX', value: string(inlineDispatchMax) }
        { name: 'BUS_STALLED_OUTBOX_SECONDS', value: string(stalledOutboxSeconds) }
        { name: 'BUS_DELIVERY_THREADS', value: string(deliveryThreads) }
        // host.json durableTask.hubName is %BUS_DURABLE_HUB%: the host resolves it from here.
        { name: 'BUS_DURABLE_HUB', value: durableHubName }
      ]
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: deploymentIdentityId
          }
        }
      }
      runtime: {
        name: 'python'
        version: '3.13'
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
        // Durable Functions on Flex Consumption: Microsoft recommends one always-ready instance
        // for the durable group (orchestrations, activities, entities) against its cold starts.
        alwaysReady: [
          { name: 'durable', instanceCount: 1 }
        ]
      }
    }
  }
}

output name string = functionApp.name
output id string = functionApp.id
output defaultHostName string = functionApp.properties.defaultHostName
output durableHubName string = durableHubName
