#!/usr/bin/env bash
# Starts a Docker engine of mcpexec's own for the Docker sandbox runtime and its
# tests, beside whatever else runs on the host (a rootful Podman, a system
# Docker): its own socket, data root and exec root, no bridge and no iptables
# rules (sandboxes run with network none). Idempotent: an engine already
# answering on the socket is left as it is. Then it loads the sandbox image
# into that engine from Podman's storage (no registry needed) unless the engine
# already has that very image (same id).
#
# Usage: start-dockerd.sh [--no-image | --stop] [IMAGE]
#   IMAGE       image to load (default $MCPEXEC_IMAGE, else localhost/mcpexec-sandbox:latest);
#               build it first with deploy/sandbox/build.sh (make image)
#   --no-image  only start the engine
#   --stop      stop the engine this script started (its data stays)
#
# Environment: MCPEXEC_DOCKER_SOCK (default /run/mcpexec-docker.sock) and
# MCPEXEC_DOCKER_ROOT (default /var/lib/mcpexec-docker: data, exec root, log).
# Needs root and Debian's docker.io (apt-get install docker.io).
# Use the engine with --runtime docker --docker unix://$MCPEXEC_DOCKER_SOCK.
set -euo pipefail

load=1
stop=0
name=""
for arg in "$@"; do
	case "$arg" in
	--no-image) load=0 ;;
	--stop) stop=1 ;;
	-h | --help)
		sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	-*)
		echo "start-dockerd.sh: unknown option $arg (try --help)" >&2
		exit 2
		;;
	*) name="$arg" ;;
	esac
done
name="${name:-${MCPEXEC_IMAGE:-localhost/mcpexec-sandbox:latest}}"
sock="${MCPEXEC_DOCKER_SOCK:-/run/mcpexec-docker.sock}"
root="${MCPEXEC_DOCKER_ROOT:-/var/lib/mcpexec-docker}"
host="unix://$sock"

for cmd in dockerd docker; do
	if ! command -v "$cmd" >/dev/null 2>&1; then
		echo "start-dockerd.sh: $cmd is not installed (apt-get install docker.io)" >&2
		exit 1
	fi
done

answers() { docker -H "$host" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if [ "$stop" -eq 1 ]; then
	pid="$(cat "$root/dockerd.pid" 2>/dev/null || true)"
	if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
		echo "no docker engine of this script runs (no live pid in $root/dockerd.pid)"
		exit 0
	fi
	kill -TERM "$pid"
	for _ in $(seq 1 60); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "start-dockerd.sh: dockerd (pid $pid) did not stop within 30s" >&2
		exit 1
	fi
	echo "stopped dockerd (pid $pid)"
	exit 0
fi

if answers; then
	echo "docker engine already answers on $host"
else
	if [ "$(id -u)" -ne 0 ]; then
		echo "start-dockerd.sh: starting the engine needs root: run it with sudo" >&2
		exit 1
	fi
	mkdir -p "$root/data" "$root/exec"
	chmod 0700 "$root"
	# A pid file of an engine that died with the machine or was killed.
	if [ -f "$root/dockerd.pid" ] && ! kill -0 "$(cat "$root/dockerd.pid")" 2>/dev/null; then
		rm -f "$root/dockerd.pid"
	fi
	rm -f "$sock"
	# --bridge none: no docker0 and no iptables rules; containers that ask for a
	# network other than none cannot start, which is all mcpexec's do.
	# Its own containerd (started by dockerd under the exec root) and no
	# userland proxy: nothing here publishes ports.
	setsid dockerd \
		--host "$host" \
		--data-root "$root/data" \
		--exec-root "$root/exec" \
		--pidfile "$root/dockerd.pid" \
		--iptables=false --ip6tables=false --ip-masq=false --bridge=none \
		--userland-proxy=false \
		--log-level warn \
		>>"$root/dockerd.log" 2>&1 </dev/null &
	pid=$!
	for _ in $(seq 1 120); do
		answers && break
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "start-dockerd.sh: dockerd exited; the end of $root/dockerd.log:" >&2
			tail -n 30 "$root/dockerd.log" >&2
			exit 1
		fi
		sleep 0.5
	done
	if ! answers; then
		echo "start-dockerd.sh: dockerd (pid $pid) did not answer on $host within 60s; the end of $root/dockerd.log:" >&2
		tail -n 30 "$root/dockerd.log" >&2
		exit 1
	fi
	echo "started dockerd $(docker -H "$host" version --format '{{.Server.Version}}') on $host" \
		"(pid $pid, storage driver $(docker -H "$host" info --format '{{.Driver}}'), data in $root)"
fi

[ "$load" -eq 1 ] || exit 0

# The image: loaded from Podman's storage, where deploy/sandbox/build.sh puts it.
recipe() { "$@" image inspect --format '{{index .Config.Labels "io.mcpexec.recipe"}}' "$name" 2>/dev/null || true; }
want="$(recipe podman)"
if [ -z "$want" ]; then
	echo "start-dockerd.sh: podman has no image $name to load: build it first (sudo deploy/sandbox/build.sh $name, or make image)" >&2
	exit 1
fi
# The same image id in both (docker load keeps the image's config, hence its id).
imgid() { "$@" image inspect --format '{{.Id}}' "$name" 2>/dev/null | sed 's/^sha256://' || true; }
if [ "$(imgid podman)" = "$(imgid docker -H "$host")" ]; then
	echo "docker engine already has $name (recipe $want)"
	exit 0
fi
start=$(date +%s)
podman save --format docker-archive "$name" | docker -H "$host" load >/dev/null
echo "loaded $name into the docker engine in $(($(date +%s) - start))s"
