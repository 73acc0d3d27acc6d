#!/usr/bin/env bash
# Provides the node's Kubernetes binaries for the end-to-end cluster (kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy, plus envtest's kube-apiserver and etcd)
# in one directory, and prints it on stdout. Built once from the Go module proxy, like envtest's;
# progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."

K8S_VERSION="${ENVTEST_K8S_VERSION:-1.37.2}"
CACHE_ROOT="${SUBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subflow}"
DEST="$CACHE_ROOT/node/k8s-$K8S_VERSION"
CMDS=(kubelet kube-controller-manager kube-scheduler kube-proxy)

log() { echo "node-binaries: $*" >&2; }
complete() { for c in "${CMDS[@]}"; do [ -x "$1/$c" ] || return 1; done; }

envtest="$(hack/setup-envtest.sh)"
mkdir -p "$DEST"
link_envtest() { for c in kube-apiserver etcd; do ln -sfn "$envtest/$c" "$DEST/$c"; done; }
if complete "$DEST"; then link_envtest; echo "$DEST"; exit 0; fi

exec 9>"$DEST.lock"
flock 9
if ! complete "$DEST"; then
  # shellcheck source=../lib/k8s-build.sh
  . hack/lib/k8s-build.sh
  work="$(mktemp -d "$CACHE_ROOT/node/build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  started=$(date +%s)
  log "building ${CMDS[*]} v$K8S_VERSION from the Go module proxy into $DEST"
  log "(first use only: about 8 minutes on two cores beyond envtest's build, 1-2 with Go's build cache warm)"
  k8s_build "$work" "$K8S_VERSION" "$DEST" "${CMDS[@]}"
  log "ready after $(( $(date +%s) - started ))s"
fi
link_envtest
echo "$DEST"
