#!/usr/bin/env bash
# Runs `make conformance` against a pulsartest broker in a separate process, which the tests
# reach only through PULSAR_URL and PULSAR_ADMIN_URL, as they would reach a real Pulsar. This
# exercises the real-broker path of the suite (no in-process hooks; fault-injection tests skip).
# Arguments are passed to the broker, e.g. -entries-per-ledger=7 or -failover-delay=1s.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

work=$(mktemp -d)
broker_pid=""
cleanup() {
	if [[ -n "$broker_pid" ]]; then
		kill "$broker_pid" 2>/dev/null || true
		wait "$broker_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# Built first so that the process we stop is the broker itself, not `go run`.
"$GO" build -o "$work/pulsartest" ./internal/testing/pulsartest/cmd/pulsartest
"$work/pulsartest" "$@" >"$work/urls" 2>"$work/log" &
broker_pid=$!

# The broker prints its URLs once it listens; give it 10 s.
for _ in $(seq 100); do
	grep -q '^PULSAR_ADMIN_URL=' "$work/urls" && break
	if ! kill -0 "$broker_pid" 2>/dev/null; then
		cat "$work/log" >&2
		echo "conformance-remote: pulsartest exited before listening" >&2
		exit 1
	fi
	sleep 0.1
done
service=$(sed -n 's/^PULSAR_SERVICE_URL=//p' "$work/urls")
admin=$(sed -n 's/^PULSAR_ADMIN_URL=//p' "$work/urls")
if [[ -z "$service" || -z "$admin" ]]; then
	echo "conformance-remote: pulsartest printed no URLs within 10 s" >&2
	exit 1
fi

# wait_port URL: wait until host:port of URL accepts a TCP connection (10 s at most).
wait_port() {
	local hostport=${1#*://}
	hostport=${hostport%%/*}
	for _ in $(seq 100); do
		if (exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	echo "conformance-remote: nothing listens on $hostport" >&2
	return 1
}
wait_port "$service"
wait_port "$admin"

echo "conformance-remote: broker process $broker_pid at $service (admin $admin)"
PULSAR_URL="$service" PULSAR_ADMIN_URL="$admin" make conformance
