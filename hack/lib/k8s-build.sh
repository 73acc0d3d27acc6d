# Sourced by hack/setup-envtest.sh and hack/e2e/node-binaries.sh: builds commands of
# k8s.io/kubernetes from the Go module proxy (no prebuilt download is possible here).
#
# k8s.io/kubernetes replaces its staging modules with local paths; a consumer module must replace
# each of them with the published k8s.io/* module of the same release. The module is a throwaway
# one in a work directory, so its dependency versions never meet the project's.

# k8s_build WORKDIR VERSION DEST CMD... builds k8s.io/kubernetes/cmd/CMD at VERSION (e.g. 1.37.2)
# into DEST/CMD, each through a .tmp file so an interrupted build leaves nothing that looks done.
k8s_build() {
  local work="$1" version="$2" dest="$3"
  shift 3
  mkdir -p "$work"
  (
    cd "$work"
    go mod init subflow.local/k8s-build >/dev/null 2>&1
    local gomod staging_version mod
    gomod="$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
    staging_version="v0.${version#1.}"
    for mod in $(sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
      go mod edit -replace "$mod=$mod@$staging_version"
    done
    go mod edit -require "k8s.io/kubernetes@v$version"
    {
      printf 'package main\n\nimport (\n'
      for cmd in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s/app"\n' "$cmd"; done
      printf ')\n\nfunc main() {}\n'
    } > deps.go
    echo "k8s-build: resolving k8s.io/kubernetes v$version dependencies" >&2
    go mod tidy >&2
    rm deps.go
    local pkg=k8s.io/component-base/version ldflags
    ldflags="-s -w -X $pkg.gitVersion=v$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$version" | cut -d. -f2)"
    ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    for cmd in "$@"; do
      echo "k8s-build: compiling $cmd v$version" >&2
      CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dest/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
      mv "$dest/$cmd.tmp" "$dest/$cmd"
    done
  )
}
