#!/usr/bin/env bash
# Runs the Python consumer application of the sidecar's tests (peer.py) with the given flags.
#
#   hack/clients/python/peer.sh --url pulsar://127.0.0.1:6650 --topic t --subscription s ...
#   hack/clients/python/peer.sh --prepare     install only (prints the venv directory)
#
# First use creates a virtual environment in the cache and installs pulsar-client
# (PULSAR_PYTHON_CLIENT, default the version below; its wheel carries the C++ library) with pip,
# printing what it downloads; later runs reuse it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
spec=${PULSAR_PYTHON_CLIENT:-pulsar-client==3.13.0}
python=${PYTHON:-python3}
cache=${SUBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subflow}/clients/python-${spec//[^A-Za-z0-9.]/_}
venv="$cache/venv"

log() { echo "python-peer: $*" >&2; }

if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import pulsar' 2>/dev/null; then
	command -v "$python" >/dev/null || { log "no $python found"; exit 1; }
	log "installing $spec into $venv (first use only; downloads listed below)"
	rm -rf "$venv"
	mkdir -p "$cache"
	"$python" -m venv "$venv"
	"$venv/bin/pip" install --disable-pip-version-check --progress-bar off "$spec" 2>&1 |
		tee "$cache/install.log" | grep -E '^(Downloading|Collecting|Successfully installed)' | sed 's/^/python-peer: /' >&2 || true
	"$venv/bin/python" -c 'import pulsar' || { tail -20 "$cache/install.log" >&2; exit 1; }
fi
if [[ "${1:-}" == "--prepare" ]]; then
	echo "$venv"
	exit 0
fi
exec "$venv/bin/python" -u "$here/peer.py" "$@"
