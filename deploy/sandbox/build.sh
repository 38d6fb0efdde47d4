#!/usr/bin/env bash
# Builds the mcpexec sandbox image locally, without any container registry:
# debootstrap a minimal Debian bookworm with python3 and nodejs, strip it, and
# `podman import` it.
#
# Usage: build.sh [--force] [IMAGE]
#   IMAGE    image name (default $MCPEXEC_IMAGE, else localhost/mcpexec-sandbox:latest)
#   --force  rebuild even if an image of this recipe already exists
#
# The Debian mirror is taken from the host's apt sources; when none is found,
# debootstrap's own default is used. Needs root (debootstrap) and podman.
set -euo pipefail

force=0
name=""
for arg in "$@"; do
	case "$arg" in
	--force | -f) force=1 ;;
	-h | --help)
		sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	-*)
		echo "build.sh: unknown option $arg (try --help)" >&2
		exit 2
		;;
	*) name="$arg" ;;
	esac
done
name="${name:-${MCPEXEC_IMAGE:-localhost/mcpexec-sandbox:latest}}"
suite="${MCPEXEC_SUITE:-bookworm}"

if ! command -v podman >/dev/null 2>&1; then
	echo "build.sh: podman is not installed (apt-get install podman runc uidmap)" >&2
	exit 1
fi

# The recipe's version, kept in the image's labels: an image of an older
# recipe (before JavaScript, say) is rebuilt, not reused.
recipe=2
if [ "$force" -eq 0 ] && podman image exists "$name"; then
	have="$(podman image inspect --format '{{index .Labels "io.mcpexec.recipe"}}' "$name" 2>/dev/null || true)"
	if [ "$have" = "$recipe" ]; then
		echo "image $name already exists (use --force to rebuild)"
		exit 0
	fi
	echo "image $name is of an older recipe (${have:-1}, now $recipe): rebuilding"
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "build.sh: debootstrap needs root: run it with sudo" >&2
	exit 1
fi

if ! command -v debootstrap >/dev/null 2>&1; then
	echo "installing debootstrap..."
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
fi

# The first mirror the host's apt already uses (deb822 first, then one-line form).
mirror=""
shopt -s nullglob
for f in /etc/apt/sources.list.d/*.sources; do
	mirror="$(awk 'tolower($1) == "uris:" { print $2; exit }' "$f")"
	[ -n "$mirror" ] && break
done
shopt -u nullglob
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
	# deb [opts] URI suite components...
	mirror="$(awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } print $i; exit }' /etc/apt/sources.list)"
fi

dir="$(mktemp -d /var/tmp/mcpexec-rootfs.XXXXXX)"
cleanup() { rm -rf --one-file-system "$dir"; }
trap cleanup EXIT

start=$(date +%s)
echo "debootstrap $suite into $dir${mirror:+ from $mirror}..."
args=(--variant=minbase --include=python3,nodejs "$suite" "$dir")
[ -n "$mirror" ] && args+=("$mirror")
debootstrap "${args[@]}"

# Shrink: nothing in the sandbox installs packages or reads docs. The compiled
# stdlib (__pycache__) stays: the root is read-only at run time, so without it every
# interpreter start would recompile what it imports.
rm -rf "$dir"/var/cache/apt/* "$dir"/var/lib/apt/lists/* \
	"$dir"/var/cache/debconf/*-old "$dir"/var/log/* \
	"$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
	"$dir"/usr/share/lintian "$dir"/usr/share/linda
find "$dir"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
# Mount points the runtime uses (the root file system is read-only at run time).
mkdir -p "$dir"/workspace "$dir"/mcpexec
chmod 1777 "$dir"/workspace

old_id="$(podman image inspect --format '{{.Id}}' "$name" 2>/dev/null || true)"
tar --numeric-owner -C "$dir" -c . |
	podman import --change 'CMD ["python3"]' --change 'WORKDIR /workspace' \
		--change "LABEL io.mcpexec.recipe=$recipe" --change 'LABEL io.mcpexec.languages=python,javascript' \
		- "$name" >/dev/null

if [ -n "$old_id" ]; then
	# The replaced image is now untagged; drop it unless a container still uses it.
	podman rmi "$old_id" >/dev/null 2>&1 || true
fi

echo "built $name in $(($(date +%s) - start))s: $(podman image inspect --format '{{.Size}}' "$name") bytes"
