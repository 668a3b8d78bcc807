// Azure Monitor alert rules on the bus's alert conditions (bus/hosting/alerts.py). Every
// maintenance pass counts each condition that holds, per endpoint, in the `eobus.alerts` metric,
// which the app's OpenTelemetry exporter sends to Application Insights: `customMetrics`, its
// attributes in `customDimensions`. One scheduled query rule per condition fires for each
// endpoint a pass counted it at within the last 15 minutes, and resolves itself once no pass
// counts it any more. The app can also call a webhook itself (BUS_ALERT_WEBHOOK); these rules
// need nothing of the app but its telemetry.

param applicationInsightsName string
param location string
param tags object
@description('Names the rules and the action group (the deployment\'s resource token).')
param resourceToken string
@description('Optional: an e-mail address told when an alert fires and when it resolves.')
param alertEmail string = ''
@secure()
@description('Optional: a webhook (Teams, Slack, an incident tool) called when an alert fires and when it resolves.')
param alertWebhookUrl string = ''

var hasReceivers = !empty(alertEmail) || !empty(alertWebhookUrl)
// The conditions of bus/hosting/alerts.py (CONDITIONS); tests/operations/infra/test_alerts.py
// checks there is a rule for each.
var conditions = [
  {
    name: 'poisoned'
    severity: 2
    description: 'Entries wait in an endpoint\'s poison queue: python -m bus dlq list ENDPOINT (docs/operating.md, "Alerts").'
  }
  {
    name: 'unserved'
    severity: 1
    description: 'Messages wait at an endpoint and no live instance serves it: python -m bus status (docs/operating.md, "Alerts").'
  }
  {
    name: 'critical_time'
    severity: 2
    description: 'The oldest message waiting at an endpoint has waited longer than BUS_ALERT_CRITICAL_SECONDS (docs/operating.md, "Alerts").'
  }
  {
    name: 'queue_depth'
    severity: 3
    description: 'An endpoint\'s queue holds more than BUS_ALERT_QUEUE_DEPTH messages (docs/operating.md, "Alerts").'
  }
  {
    name: 'stuck_session'
    severity: 2
    description: 'A session has waited on a gap longer than its endpoint\'s reorder window: python -m bus sessions list ENDPOINT (docs/operating.md, "Alerts").'
  }
]

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (hasReceivers) {
  name: 'ag-bus-${resourceToken}'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'busalerts'
    enabled: true
    emailReceivers: empty(alertEmail) ? [] : [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
    webhookReceivers: empty(alertWebhookUrl) ? [] : [
      {
        name: 'webhook'
        serviceUri: alertWebhookUrl
        useCommonAlertSchema: true
      }
    ]
  }
}

resource rules 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [for condition in conditions: {
  name: 'bus-${replace(condition.name, '_', '-')}-${resourceToken}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'bus: ${condition.name}'
    description: condition.description
    severity: condition.severity
    enabled: true
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    scopes: [
      applicationInsights.id
    ]
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "eobus.alerts" | where tostring(customDimensions["eobus.alert.condition"]) == "${condition.name}" | extend endpoint = tostring(customDimensions["messaging.destination.name"]) | summarize counted = sum(value) by endpoint'
          timeAggregation: 'Total'
          metricMeasureColumn: 'counted'
          dimensions: [
            {
              name: 'endpoint'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: hasReceivers ? [
        actionGroup.id
      ] : []
    }
  }
}]

output ruleNames array = [for (condition, i) in conditions: rules[i].name]
