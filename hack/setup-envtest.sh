#!/usr/bin/env bash
# Provides envtest binaries (kube-apiserver, etcd, kubectl) and prints their directory on stdout.
#
# Order: $KUBEBUILDER_ASSETS if it holds the binaries; an existing setup-envtest cache; our own
# cache; otherwise build both servers from the Go module proxy (no prebuilt download is possible
# here). Progress goes to stderr so callers can use: export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)
set -euo pipefail

K8S_VERSION="${ENVTEST_K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ENVTEST_ETCD_VERSION:-3.6.16}"
CACHE_ROOT="${SUBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subflow}"
DEST="$CACHE_ROOT/envtest/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"

log() { echo "setup-envtest: $*" >&2; }

has_binaries() { [ -x "$1/kube-apiserver" ] && [ -x "$1/etcd" ]; }

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && has_binaries "$KUBEBUILDER_ASSETS"; then
  echo "$KUBEBUILDER_ASSETS"; exit 0
fi
for dir in "$HOME/.local/share/kubebuilder-envtest/k8s/$K8S_VERSION-linux-amd64" \
           "$HOME/.local/share/kubebuilder-envtest/k8s/$K8S_VERSION-$(go env GOOS)-$(go env GOARCH)"; do
  if has_binaries "$dir"; then echo "$dir"; exit 0; fi
done
if has_binaries "$DEST"; then echo "$DEST"; exit 0; fi

mkdir -p "$DEST"
# One build at a time, even when make test and make demo start together.
exec 9>"$DEST.lock"
flock 9
if has_binaries "$DEST"; then echo "$DEST"; exit 0; fi

work="$(mktemp -d "$CACHE_ROOT/envtest/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
log "building kube-apiserver v$K8S_VERSION and etcd v$ETCD_VERSION from the Go module proxy"
log "into $DEST (first use only: about 15 minutes on two cores; later runs reuse it)"

# etcd: its own throwaway module, so its dependency versions never meet Kubernetes'.
mkdir -p "$work/etcd"
(
  cd "$work/etcd"
  go mod init subflow.local/envtest-etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2
  log "compiling etcd"
  CGO_ENABLED=0 go build -trimpath -o "$DEST/etcd.tmp" go.etcd.io/etcd/server/v3
)
mv "$DEST/etcd.tmp" "$DEST/etcd"
log "etcd ready after $(( $(date +%s) - started ))s"

# kube-apiserver (the long part).
# shellcheck source=lib/k8s-build.sh
. "$(dirname "$0")/lib/k8s-build.sh"
k8s_build "$work/apiserver" "$K8S_VERSION" "$DEST" kube-apiserver
if command -v kubectl >/dev/null 2>&1 && [ ! -e "$DEST/kubectl" ]; then
  ln -s "$(command -v kubectl)" "$DEST/kubectl"
fi
log "envtest binaries ready in $DEST after $(( $(date +%s) - started ))s"
echo "$DEST"
