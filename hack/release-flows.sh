#!/usr/bin/env bash
# Deletes every SubscriptionFlow and waits until each is gone. The controller's finalizer
# releases a flow's rule in its pods before the flow goes, so this must run while the controller
# still does: before the controller or the CRD is removed (make undeploy, make uninstall).
#
#   RELEASE_TIMEOUT  how long to wait for the controller (default 120s)
#   FORCE=1          the controller is gone for good: remove the finalizers instead, leaving
#                    the pods' agents as they are (paused consumers stay paused until restarted)
set -euo pipefail

kubectl=${KUBECTL:-kubectl}
resource=subscriptionflows.subflow.dev
timeout=${RELEASE_TIMEOUT:-120s}

if ! $kubectl get crd "$resource" >/dev/null 2>&1; then
  exit 0 # not installed: nothing to release
fi
flows=$($kubectl get "$resource" --all-namespaces -o name | wc -l)
if [ "$flows" -eq 0 ]; then
  exit 0
fi

if [ "${FORCE:-}" = 1 ]; then
  echo "FORCE=1: removing the finalizers of $flows SubscriptionFlows; their pods' agents keep the state they have." >&2
  $kubectl get "$resource" --all-namespaces -o jsonpath='{range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}' |
    while read -r namespace name; do
      $kubectl patch "$resource" "$name" -n "$namespace" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null
    done
  $kubectl delete "$resource" --all --all-namespaces --wait=true >/dev/null
  exit 0
fi

echo "Deleting $flows SubscriptionFlows; the controller releases their pods first (waiting up to $timeout) ..." >&2
$kubectl delete "$resource" --all --all-namespaces --wait=false >/dev/null
if ! $kubectl wait --for=delete "$resource" --all --all-namespaces --timeout="$timeout" >/dev/null 2>&1; then
  left=$($kubectl get "$resource" --all-namespaces -o name | wc -l)
  cat >&2 <<MSG
error: $left SubscriptionFlows are still terminating after $timeout: the controller releases their
pods before they go, and it does not seem to run. Nothing else was removed.
  - Start the controller (make deploy, or make run) and run this again; or
  - if the controller is gone for good, run again with FORCE=1 to remove their finalizers, which
    leaves each pod's agent as it is (paused consumers stay paused until the pod restarts).
MSG
  exit 1
fi
