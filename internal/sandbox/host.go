package sandbox

// This file holds what container runtimes share about the host: the private
// directory of the runners' sockets and the owner label that lets a runtime
// reap the containers of a worker that died.
import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultRunDir is where runner sockets live unless configured: under
// /run/mcpexec for root, else under $XDG_RUNTIME_DIR (a per-user tmpfs), else
// under the temporary directory.
func DefaultRunDir() string {
	if os.Geteuid() == 0 {
		return "/run/mcpexec"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "mcpexec")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("mcpexec-%d", os.Geteuid()))
}

// PrivateDir makes dir (0700, owned by us) and a fresh 0700 directory in it
// for one runtime, which it returns. Each container's own directory inside is
// bind-mounted into the container, which therefore needs no access to these.
func PrivateDir(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", err
	}
	base, err := os.MkdirTemp(dir, "w-")
	if err != nil {
		return "", err
	}
	return base, os.Chmod(base, 0o700)
}

var (
	// HostName is this host's name, as owner labels carry it.
	HostName, _ = os.Hostname()
	// OwnerLabel names this process (host, pid and the pid's start time) for
	// the containers it makes: a container whose owner is gone may be reaped
	// by any runtime on the host.
	OwnerLabel = fmt.Sprintf("%s/%d/%d", HostName, os.Getpid(), processStart(os.Getpid()))
)

// OwnerAlive parses an OwnerLabel value and reports whether that process
// still runs (same pid, same start time).
func OwnerAlive(label string) (host string, alive, ok bool) {
	i := strings.LastIndex(label, "/")
	j := strings.LastIndex(label[:max(i, 0)], "/")
	if i < 0 || j < 0 {
		return "", false, false
	}
	pid, err1 := strconv.Atoi(label[j+1 : i])
	start, err2 := strconv.ParseUint(label[i+1:], 10, 64)
	if err1 != nil || err2 != nil {
		return "", false, false
	}
	return label[:j], processStart(pid) == start && start != 0, true
}

// processStart returns pid's start time in clock ticks since boot (field 22
// of /proc/PID/stat), or 0 when there is no such process.
func processStart(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: count from after its ')'.
	rest := string(data[strings.LastIndexByte(string(data), ')')+1:])
	f := strings.Fields(rest)
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64) // field 22 is the 20th after the name
	return n
}

// ShortID is a container id as logs and errors show it: its first 12
// characters.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// FormatBytes shows n in the largest binary unit that divides it.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
