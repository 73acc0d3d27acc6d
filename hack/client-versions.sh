#!/usr/bin/env bash
# Runs the agent's tests with each older pulsar-client-go release users may build with
# (go.mod pins the newest; a user's module that requires another gets that one under the agent).
#
#   hack/client-versions.sh [version...]     default: CLIENT_VERSIONS or v0.19.0 v0.20.0
#
# Each run uses a temporary copy of the module whose go.mod requires that version (go get), so
# the tree itself is left alone. PULSAR_URL and PULSAR_ADMIN_URL, when set, reach the tests;
# CLIENT_TEST_COUNT (default 1) repeats them, to measure a flake.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || read -r -a versions <<<"${CLIENT_VERSIONS:-v0.19.0 v0.20.0}"

for v in "${versions[@]}"; do
	copy=$(mktemp -d "${TMPDIR:-/tmp}/subflow-client-$v.XXXXXX")
	trap 'rm -rf "$copy"' EXIT
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$copy" 2>/dev/null || true
	echo "== agent tests with pulsar-client-go $v"
	(
		cd "$copy"
		"$GO" get "github.com/apache/pulsar-client-go@$v" >/dev/null
		"$GO" mod tidy >/dev/null
		got=$("$GO" list -m -f '{{.Version}}' github.com/apache/pulsar-client-go)
		[[ "$got" == "$v" ]] || { echo "client-versions: the copy builds with $got, not $v" >&2; exit 1; }
		"$GO" test -race -count=${CLIENT_TEST_COUNT:-1} -timeout 30m ./agent/... ./internal/testing/wirerec/...
	)
	rm -rf "$copy"
	trap - EXIT
done
