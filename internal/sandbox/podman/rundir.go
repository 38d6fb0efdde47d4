package podman

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// User namespace modes (Config.UserNS).
const (
	UserNSAuto = "auto" // each container its own, when the host and Podman allow it safely
	UserNSOn   = "on"   // each container its own whenever the host has the ids
	UserNSHost = "host" // the host's
)

// subIDsFix is what an operator adds to give containers their own user
// namespaces.
const subIDsFix = "add `containers:2147483647:2147483648` to /etc/subuid and /etc/subgid (make deps does)"

// userNSMode decides whether containers get their own user namespace, and
// says why not when they do not.
func userNSMode(mode string, rootless bool, serverVersion string) (bool, string) {
	switch {
	case mode == UserNSHost:
		return false, "--userns host"
	case rootless:
		return false, "rootless Podman: per-container user namespaces need many subordinate ids per user; run the worker as root for them"
	case !autoUserNSAvailable(rootless):
		return false, "no subordinate ids for Podman's \"containers\" user: " + subIDsFix
	case mode == UserNSAuto && majorVersion(serverVersion) < 5:
		// Seen here with 4.3.1, and reported upstream for 4.2 (podman issue
		// 16062): the service ends up holding its storage and userns locks
		// for good when --userns=auto containers come and go in parallel.
		return false, fmt.Sprintf("Podman %s's service deadlocks with --userns=auto under load (upstream issue 16062): "+
			"upgrade to Podman 5, or pass --userns on to use it anyway", serverVersion)
	}
	return true, ""
}

func majorVersion(v string) int {
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// autoUserNSAvailable reports whether Podman can give each container its own
// user namespace (--userns=auto): rootful Podman takes the ids from the
// "containers" entries of /etc/subuid and /etc/subgid.
func autoUserNSAvailable(rootless bool) bool {
	if rootless {
		return false // rootless auto needs many subordinate ids per user; not attempted
	}
	return hasSubIDs("/etc/subuid", "containers") && hasSubIDs("/etc/subgid", "containers")
}

// hasSubIDs reports whether file gives user a range of at least 65536 ids
// (the container's nobody, 65534, must be mapped).
func hasSubIDs(file, user string) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }() // read only: closing cannot lose data
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(parts) != 3 || parts[0] != user {
			continue
		}
		var n uint64
		if _, err := fmt.Sscan(parts[2], &n); err == nil && n >= 65536 {
			return true
		}
	}
	return false
}
