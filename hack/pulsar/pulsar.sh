#!/usr/bin/env bash
# A real Apache Pulsar standalone broker from Maven artifacts, for tests, the demo and chaos.
#
#   hack/pulsar/pulsar.sh run  [--set key=value]...            foreground; Ctrl-C stops it
#   hack/pulsar/pulsar.sh exec [--set key=value]... -- cmd...  runs cmd with PULSAR_URL and
#                                                               PULSAR_ADMIN_URL set, then stops it
#   hack/pulsar/pulsar.sh classpath                             resolves the jars only (CI warm-up)
#
# PULSAR_VERSION picks the release (default: the one pom.xml names). --set overrides a line of
# standalone.conf. PULSAR_ADVERTISED_ADDRESS (default localhost) is the address the broker gives
# clients and PULSAR_URL names; with another one, also --set bindAddress=0.0.0.0. The broker runs in a new temporary directory on free loopback ports with
# --wipe-data, and is stopped by pid when the script ends, however it ends: a watchdog process
# stops the JVM even if this script is killed outright. Start-up fails within
# PULSAR_START_TIMEOUT seconds (default 180) with the reason and the log's last lines.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
default_version=$(sed -n 's:.*<pulsar.version>\(.*\)</pulsar.version>.*:\1:p' "$here/pom.xml")
version=${PULSAR_VERSION:-$default_version}
cache=${SUBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subflow}/pulsar
start_timeout=${PULSAR_START_TIMEOUT:-180}
advertised=${PULSAR_ADVERTISED_ADDRESS:-localhost}

log() { echo "pulsar: $*" >&2; }
die() { log "$*"; exit 1; }

# java_cmd prints the java to run: $JAVA_HOME's, else the one on PATH; Pulsar 4.x needs 17+.
java_cmd() {
	local java=java
	[[ -n "${JAVA_HOME:-}" ]] && java="$JAVA_HOME/bin/java"
	command -v "$java" >/dev/null || die "no Java found (install a JDK 17 or newer, or set JAVA_HOME)"
	local major
	major=$("$java" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
	[[ "${major%%.*}" -ge 17 ]] 2>/dev/null || die "Pulsar $version needs Java 17 or newer; $java is $major (set JAVA_HOME)"
	echo "$java"
}

# classpath resolves the broker's jars once and prints the file that lists them. Maven caches
# the jars in ~/.m2; a listed jar that went missing makes it resolve again.
classpath() {
	local file="$cache/classpath-$version.txt"
	if [[ -s "$file" ]] && tr ':' '\n' <"$file" | while read -r jar; do [[ -f "$jar" ]] || exit 1; done; then
		echo "$file"
		return
	fi
	command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch Pulsar $version's jars"
	mkdir -p "$cache"
	local mvnlog="$cache/resolve-$version.log"
	log "resolving Apache Pulsar $version's broker jars with Maven (first time only: ~300 jars, ~270 MB into ~/.m2, a minute or two; log in $mvnlog)"
	if ! mvn -B -f "$here/pom.xml" dependency:build-classpath -Dpulsar.version="$version" \
		-Dmdep.outputFile="$file.tmp" 2>&1 | tee "$mvnlog" |
		awk '/Downloaded from/ { if (++n % 50 == 0) { printf "pulsar: downloaded %d files\n", n > "/dev/stderr" } }'; then
		:
	fi
	if [[ ! -s "$file.tmp" ]]; then
		grep -E '^\[ERROR\]' "$mvnlog" | head -5 >&2 || true
		die "could not resolve org.apache.pulsar:pulsar-broker:$version (see $mvnlog)"
	fi
	mv "$file.tmp" "$file"
	log "Pulsar $version's classpath is cached in $file"
	echo "$file"
}

# free_port prints a loopback port nothing listens on, other than the ones in $taken. It picks
# below the kernel's ephemeral range, so no outgoing connection can take the port in the seconds
# between this check and the JVM's bind.
taken=" "
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
	local port low=10000
	((ephemeral_low > low + 1000)) || low=$((ephemeral_low - 1000))
	for _ in $(seq 50); do
		port=$((low + RANDOM % (ephemeral_low - low)))
		if [[ "$taken" != *" $port "* ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
	die "found no free port"
}

work="" jvm="" watchdog=""
stop() {
	if [[ -n "$jvm" ]] && kill -0 "$jvm" 2>/dev/null; then
		kill "$jvm" 2>/dev/null || true
		# The JVM's shutdown hooks close the broker and the bookie; give them 20 s.
		for _ in $(seq 200); do kill -0 "$jvm" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$jvm" 2>/dev/null || true
		wait "$jvm" 2>/dev/null || true
	fi
	[[ -n "$watchdog" ]] && kill "$watchdog" 2>/dev/null || true
	[[ -n "$work" ]] && rm -rf "$work"
	return 0
}

# start launches the broker with the overrides in "$@" and returns once it serves. Another
# process may still bind a port between free_port's check and the JVM's bind (a concurrent
# broker, a test's listener); then it starts again on fresh ports, up to three times.
start() {
	trap stop EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	local attempt
	for attempt in 1 2 3; do
		launch "$@" && return
		log "a port was taken before the broker bound it (attempt $attempt of 3); starting again on fresh ports"
		stop
		jvm="" watchdog="" work=""
	done
	fail "the broker could not bind its ports in 3 attempts"
}

# launch starts one broker; it returns 1 if the broker exited because a port was in use, and
# fails the script for any other reason.
launch() {
	local java cp
	java=$(java_cmd)
	cp=$(classpath)
	work=$(mktemp -d "${TMPDIR:-/tmp}/subflow-pulsar.XXXXXX")

	local broker_port web_port bookie_port
	broker_port=${PULSAR_PORT:-$(free_port)}
	taken+="$broker_port "
	web_port=${PULSAR_ADMIN_PORT:-$(free_port)}
	taken+="$web_port "
	bookie_port=$(free_port)
	taken+="$bookie_port "
	{
		cat "$here/standalone.conf"
		echo "brokerServicePort=$broker_port"
		echo "webServicePort=$web_port"
		for kv in "$@"; do echo "$kv"; done
	} >"$work/standalone.conf"

	log "starting Apache Pulsar $version standalone (10-60 s; log in $work/broker.log)"
	# JVM options as the distribution's bin/pulsar sets them for Java 17.
	(cd "$work" && exec "$java" -Xms256m -Xmx${PULSAR_HEAP:-768m} -XX:MaxDirectMemorySize=${PULSAR_DIRECT_MEMORY:-512m} \
		-XX:+UseG1GC -Djava.net.preferIPv4Stack=true \
		--add-opens java.base/java.io=ALL-UNNAMED --add-opens java.base/java.util.zip=ALL-UNNAMED \
		--add-opens java.base/sun.net=ALL-UNNAMED --add-opens java.management/sun.management=ALL-UNNAMED \
		--add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED \
		--add-opens java.base/jdk.internal.platform=ALL-UNNAMED --add-opens java.base/java.lang=ALL-UNNAMED \
		--add-opens java.base/java.nio=ALL-UNNAMED --add-opens java.base/jdk.internal.misc=ALL-UNNAMED \
		-Dio.netty.tryReflectionSetAccessible=true \
		-Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver \
		-Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver \
		-Dlog4j.configurationFile="$here/log4j2.xml" -Dpulsar.log.file="$work/broker.log" \
		-cp "$(cat "$cp")" org.apache.pulsar.PulsarStandaloneStarter -c "$work/standalone.conf" \
		--no-functions-worker --no-stream-storage -a "$advertised" --wipe-data \
		--metadata-dir "$work/metadata" --bookkeeper-dir "$work/bookkeeper" --bookkeeper-port "$bookie_port" \
		>"$work/stdout.log" 2>&1) &
	jvm=$!
	# If this script dies without running its traps (SIGKILL), the watchdog still stops the JVM.
	(trap '' INT; while kill -0 $$ 2>/dev/null; do sleep 1; done; kill -9 "$jvm" 2>/dev/null; rm -rf "$work") >/dev/null 2>&1 &
	watchdog=$!

	PULSAR_URL="pulsar://$advertised:$broker_port"
	PULSAR_ADMIN_URL="http://$advertised:$web_port"
	local deadline=$((SECONDS + start_timeout))
	# Ready when the default namespace exists and the broker's health check (a produce and a
	# consume on a system topic) passes.
	until curl -fsS -m 5 -o /dev/null "$PULSAR_ADMIN_URL/admin/v2/namespaces/public/default" 2>/dev/null &&
		curl -fsS -m 30 -o /dev/null "$PULSAR_ADMIN_URL/admin/v2/brokers/health" 2>/dev/null; do
		if ! kill -0 "$jvm" 2>/dev/null; then
			# A fixed port (PULSAR_PORT, PULSAR_ADMIN_PORT) taken stays taken: no retry then.
			if port_in_use_logged && [[ -z "${PULSAR_PORT:-}${PULSAR_ADMIN_PORT:-}" ]]; then
				return 1
			fi
			fail "the broker exited during start-up"
		fi
		if ((SECONDS >= deadline)); then
			fail "the broker did not answer within ${start_timeout}s"
		fi
		sleep 0.5
	done
	log "Apache Pulsar $version is up after ${SECONDS}s (pid $jvm)"
	export PULSAR_URL PULSAR_ADMIN_URL PULSAR_VERSION="$version"
}

# port_in_use_logged says whether the broker's logs report a port it could not bind.
port_in_use_logged() {
	grep -qsE 'Address already in use|BindException' "$work/broker.log" "$work/stdout.log"
}

# fail reports why the broker did not start, with the lines of its logs that say so.
fail() {
	log "$1"
	local reason
	reason=$(grep -hoE 'Address already in use|BindException[^ ]*|UnsupportedClassVersionError[^ ]*|ClassNotFoundException[^ ]*|OutOfMemoryError[^ ]*' \
		"$work/broker.log" "$work/stdout.log" 2>/dev/null | sort -u | head -3 || true)
	[[ -n "$reason" ]] && log "reason: $reason"
	log "last lines of the broker's logs:"
	tail -n 25 "$work/stdout.log" "$work/broker.log" >&2 2>/dev/null || true
	exit 1
}

# parse_sets collects leading --set key=value arguments into sets, the rest into rest.
sets=()
parse_sets() {
	while [[ $# -gt 0 && "$1" == --set ]]; do
		[[ "${2:-}" == *=* ]] || die "--set needs key=value, got '${2:-}'"
		sets+=("$2")
		shift 2
	done
	rest=("$@")
}

cmd=${1:-}
shift || true
case "$cmd" in
classpath)
	classpath >/dev/null
	;;
run)
	parse_sets "$@"
	[[ ${#rest[@]} -eq 0 ]] || die "run takes only --set key=value"
	start "${sets[@]+"${sets[@]}"}"
	echo "PULSAR_URL=$PULSAR_URL"
	echo "PULSAR_ADMIN_URL=$PULSAR_ADMIN_URL"
	log "Ctrl-C stops it"
	wait "$jvm" || true
	fail "the broker exited"
	;;
exec)
	parse_sets "$@"
	[[ "${rest[0]:-}" == -- ]] || die "usage: pulsar.sh exec [--set key=value]... -- command..."
	rest=("${rest[@]:1}")
	[[ ${#rest[@]} -gt 0 ]] || die "exec needs a command after --"
	start "${sets[@]+"${sets[@]}"}"
	echo "PULSAR_URL=$PULSAR_URL PULSAR_ADMIN_URL=$PULSAR_ADMIN_URL" >&2
	status=0
	"${rest[@]}" || status=$?
	exit "$status"
	;;
*)
	die "usage: pulsar.sh run|exec|classpath (see the comment at the top of $0)"
	;;
esac
