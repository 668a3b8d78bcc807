// Writes the topic files - one recipient list per topic, the blob the bus reads to publish - from
// topology.json, with a deployment script (Azure CLI) running as its own identity. The blob
// names and contents in topology.json are produced by the bus's own code, byte for byte.

param name string
param location string
param tags object
@description('Resource id of the user-assigned identity the script runs as.')
param identityId string
param storageAccountName string
@description('Changes on every deployment, so the script runs each time and the files always match topology.json.')
param updateTag string = utcNow()

var topology = loadJsonContent('../topology.json')
// "<blob name> <content, base64>" per topic: base64 keeps the JSON intact through the shell.
var topicLines = [for topic in topology.topics: '${topic.blob} ${base64(topic.content)}']

resource writeTopics 'Microsoft.Resources/deploymentScripts@2023-08-01' = {
  name: name
  location: location
  tags: tags
  kind: 'AzureCLI'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    azCliVersion: '2.61.0'
    forceUpdateTag: updateTag
    timeout: 'PT30M'
    retentionInterval: 'PT1H'
    cleanupPreference: 'OnSuccess'
    environmentVariables: [
      { name: 'ACCOUNT', value: storageAccountName }
      { name: 'CONTAINER', value: topology.topicContainer }
      { name: 'TOPICS', value: join(topicLines, '\n') }
    ]
    scriptContent: loadTextContent('topics.sh')
  }
}

output topicCount int = length(topology.topics)
