#!/usr/bin/env bash
# Writes the topic files (recipient lists) of infra/topology.json into the topic container -
# the exact bytes the bus writes - and deletes topic files that are no longer in it.
#
# Runs in the deployment script's Azure CLI container as its own identity, which holds Storage
# Blob Data Contributor on the topic container only; the account takes no keys (--auth-mode login).
# Environment:
#   ACCOUNT    storage account name
#   CONTAINER  topic container name
#   TOPICS     one line per topic: "<blob name> <content, base64>"
# A new role assignment can take minutes to apply, so every storage call is retried.
set -euo pipefail

RETRY_SECONDS="${RETRY_SECONDS:-30}"
RETRIES="${RETRIES:-10}"

retry() {
  local attempt
  for ((attempt = 1; attempt <= RETRIES; attempt++)); do
    if "$@"; then
      return 0
    fi
    echo "attempt ${attempt}/${RETRIES} failed: $*; again in ${RETRY_SECONDS} s" >&2
    sleep "${RETRY_SECONDS}"
  done
  return 1
}

storage=(--auth-mode login --account-name "${ACCOUNT}" --container-name "${CONTAINER}" --only-show-errors)
work="$(mktemp -d)"
wanted=" "

while read -r blob content; do
  [[ -n "${blob}" ]] || continue
  printf '%s' "${content}" | base64 -d > "${work}/${blob}"
  retry az storage blob upload "${storage[@]}" --name "${blob}" --file "${work}/${blob}" \
    --content-type application/json --overwrite --output none
  echo "wrote ${CONTAINER}/${blob}"
  wanted+="${blob} "
done <<< "${TOPICS}"

existing="$(retry az storage blob list "${storage[@]}" --query '[].name' --output tsv)"
for blob in ${existing}; do
  if [[ "${wanted}" != *" ${blob} "* ]]; then
    retry az storage blob delete "${storage[@]}" --name "${blob}" --output none
    echo "deleted ${CONTAINER}/${blob}: no longer a topic of the app"
  fi
done
