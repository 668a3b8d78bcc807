# The Azure Functions app (Python v2 programming model) lands with the Functions issue (#3):
# queue-triggered endpoints built on the `bus` package and a Durable Functions orchestration
# for the outbox fan-out. Until then this file only reserves its place in the layout.
