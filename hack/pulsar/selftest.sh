#!/usr/bin/env bash
# Checks that pulsar.sh fails fast with its reason and never leaves a JVM behind: no Java, a
# release that does not resolve, a port already taken, and the script stopped by SIGTERM or
# killed outright while the broker runs. Run by CI (make pulsar-selftest).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pulsar="$here/pulsar.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0

check() { # check NAME COMMAND...: report whether the command held
	local name=$1
	shift
	if "$@"; then echo "ok   $name"; else echo "FAIL $name"; failed=1; fi
}

# fails_with PATTERN ENV... : pulsar.sh exec fails within 60 s and says PATTERN.
fails_with() {
	local pattern=$1
	shift
	env "$@" timeout 60 "$pulsar" exec -- true >"$out/log" 2>&1 && return 1
	grep -q "$pattern" "$out/log" || { cat "$out/log"; return 1; }
}

# jvms DIR prints the pids of the broker JVMs started in work directory DIR.
jvms() { pgrep -f "org.apache.pulsar.PulsarStandaloneStarter -c $1" || true; }

# no_jvm_within SECONDS WORKDIR: every broker JVM of that work directory ends in time.
no_jvm_within() {
	local deadline=$((SECONDS + $1))
	while [[ -n "$(jvms "$2")" ]]; do
		((SECONDS < deadline)) || { echo "JVM left: $(jvms "$2")"; return 1; }
		sleep 0.2
	done
}

# started_broker LOG: waits until the script in the background printed its URLs, and prints
# the broker's work directory.
started_broker() {
	local deadline=$((SECONDS + 180))
	until grep -q '^PULSAR_URL=' "$1" 2>/dev/null; do
		((SECONDS < deadline)) || return 1
		sleep 0.2
	done
	sed -n 's/.*log in \(.*\)\/broker.log.*/\1/p' "$1" | head -1
}

check "no Java: fails at once and says so" fails_with "no Java found" JAVA_HOME=/nonexistent
check "a release that does not resolve: fails and names it" fails_with "could not resolve org.apache.pulsar:pulsar-broker:0.0.0-none" PULSAR_VERSION=0.0.0-none

# A port taken by another broker: the inner start fails with the reason, the outer one stays.
port_taken() {
	"$pulsar" exec -- sh -c 'PULSAR_PORT=${PULSAR_URL##*:} PULSAR_START_TIMEOUT=60 "$0" exec -- true' "$pulsar" >"$out/log" 2>&1 && return 1
	grep -q "reason: .*Address already in use" "$out/log" || { cat "$out/log"; return 1; }
}
check "a port already taken: fails with the reason" port_taken

stopped_by() { # stopped_by SIGNAL: the script gets SIGNAL while the broker runs
	# One log per signal: the redirection happens in the child, so a reused file could still
	# show the previous broker's URL when the wait below first reads it.
	local log="$out/run-$1.log"
	"$pulsar" run >"$log" 2>&1 &
	local script=$!
	local work
	work=$(started_broker "$log") || { kill -9 "$script"; cat "$log"; return 1; }
	[[ -n "$(jvms "$work")" ]] || { echo "no broker JVM found for $work"; return 1; }
	kill "-$1" "$script"
	wait "$script" 2>/dev/null
	no_jvm_within 30 "$work"
}
check "SIGTERM to the script stops the broker" stopped_by TERM
check "SIGKILL to the script: the watchdog stops the broker" stopped_by KILL

exit "$failed"
