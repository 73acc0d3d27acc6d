#!/usr/bin/env bash
# make e2e: the end-to-end suite on a real single-node Kubernetes (internal/testing/realcluster).
# Installs the container runtime from Debian's packages when missing, builds the node's binaries
# (cached) and the images, then runs ./e2e/, which starts the cluster and a real Pulsar, and
# tears both down however it ends. Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."

[ "$(id -u)" = 0 ] || { echo "e2e: the cluster needs root (network namespace, cgroups, mounts)" >&2; exit 1; }
missing=()
for cmd in containerd runc ctr iptables conntrack nsenter ip; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
[ -x /usr/lib/cni/bridge ] || missing+=(cni)
if [ ${#missing[@]} -gt 0 ]; then
  echo "e2e: installing the container runtime from Debian's packages (missing: ${missing[*]})" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    containerd runc containernetworking-plugins iptables conntrack util-linux iproute2 >/dev/null
fi
command -v kubectl >/dev/null || { echo "e2e: kubectl is needed on PATH" >&2; exit 1; }

binaries=$(hack/e2e/node-binaries.sh)
images=dist/e2e-images
echo "e2e: building the images into $images" >&2
go run ./hack/images -registry subflow.local -tag e2e -out "$images" controller sidecar example-consumer pause java-peer python-peer
# The same controller under a second tag: the upgrade during an incident (helm upgrade).
go run ./hack/images -registry subflow.local -tag e2e-next -out "$images/next" controller
hack/pulsar/pulsar.sh classpath

export SUBFLOW_E2E=1 SUBFLOW_NODE_BINARIES="$binaries" SUBFLOW_E2E_IMAGES="$PWD/$images"
if [ -n "${E2E_BENCH:-}" ]; then
  # The e2e part of the benchmark report; every other package is read from its part in bench-runs/.
  exec go run ./hack/benchreport -parts bench-runs -resume ./...
fi
go test -race -count=1 -timeout 40m -v ${E2E_RUN:+-run "$E2E_RUN"} ./e2e/
