#!/usr/bin/env bash
# Runs the Java consumer application of the sidecar's tests (Peer.java) with the given flags.
#
#   hack/clients/java/peer.sh --url pulsar://127.0.0.1:6650 --topic t --subscription s ...
#   hack/clients/java/peer.sh --prepare     resolve and compile only (prints the run directory)
#
# First use resolves org.apache.pulsar:pulsar-client (PULSAR_CLIENT_VERSION, default the pom's)
# with Maven into ~/.m2 and compiles Peer.java with javac into the cache; both are reused after.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
default_version=$(sed -n 's:.*<pulsar.version>\(.*\)</pulsar.version>.*:\1:p' "$here/pom.xml")
version=${PULSAR_CLIENT_VERSION:-$default_version}
cache=${SUBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subflow}/clients/java-$version
src="$here/src/main/java/dev/subflow/peer/Peer.java"

log() { echo "java-peer: $*" >&2; }

prepare() {
	mkdir -p "$cache"
	local cp="$cache/classpath.txt"
	if [[ ! -s "$cp" ]] || ! tr ':' '\n' <"$cp" | while read -r jar; do [[ -f "$jar" ]] || exit 1; done; then
		command -v mvn >/dev/null || { log "Maven (mvn) is needed"; exit 1; }
		log "resolving org.apache.pulsar:pulsar-client:$version with Maven (first use only; downloads listed below, log in $cache/resolve.log)"
		mvn -B -f "$here/pom.xml" dependency:build-classpath -Dpulsar.version="$version" \
			-Dmdep.outputFile="$cp.tmp" >"$cache/resolve.log" 2>&1 || { tail -20 "$cache/resolve.log" >&2; exit 1; }
		grep -o 'Downloaded from [^ ]* [^ ]*' "$cache/resolve.log" | sed 's/^Downloaded from [^ ]* /java-peer: downloaded /' >&2 || true
		mv "$cp.tmp" "$cp"
	fi
	local classes="$cache/classes"
	if [[ ! -f "$classes/dev/subflow/peer/Peer.class" || "$src" -nt "$classes/dev/subflow/peer/Peer.class" ]]; then
		log "compiling Peer.java"
		rm -rf "$classes" && mkdir -p "$classes"
		javac --release 17 -nowarn -cp "$(cat "$cp")" -d "$classes" "$src"
	fi
}

prepare
if [[ "${1:-}" == "--prepare" ]]; then
	echo "$cache"
	exit 0
fi
exec java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$cache/classes:$(cat "$cache/classpath.txt")" dev.subflow.peer.Peer "$@"
