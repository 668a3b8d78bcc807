// Whoever runs `func azure functionapp publish` (a person or a pipeline): Website Contributor on
// the Function App, so it can publish through the app's SCM endpoint (/api/publish). It needs no
// storage role: on Flex Consumption the platform writes the package into the deployment
// container with the deployment identity (main.bicep, deployIdentity; rbac.bicep, deployPackage).

@description('Name of the Function App.')
param functionAppName string
@description('Object id of the user, group or service principal that publishes the app.')
param publisherPrincipalId string
@allowed(['User', 'Group', 'ServicePrincipal'])
param publisherPrincipalType string = 'User'

var websiteContributor = 'de139f84-1756-47ae-9be6-808fbbe84772' // Website Contributor: manage web apps (publish, settings), not their access

resource functionApp 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource publish 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(functionApp.id, publisherPrincipalId, websiteContributor)
  scope: functionApp
  properties: {
    principalId: publisherPrincipalId
    principalType: publisherPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', websiteContributor)
  }
}
