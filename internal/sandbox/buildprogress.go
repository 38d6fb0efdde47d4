package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var unsafeImageChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// BuildProgressPath is the file an image build in progress writes its output
// to (its first line is "pid N"), so that another process (doctor) can say a
// build is under way and how far it got.
func BuildProgressPath(image string) string {
	return filepath.Join(os.TempDir(), "mcpexec-image-build-"+unsafeImageChars.ReplaceAllString(image, "_")+".log")
}

// BuildProgress is a build in progress, as its progress file says.
type BuildProgress struct {
	PID     int
	Updated time.Time // when it last wrote
	Last    string    // the build's last line of output
}

// ReadBuildProgress reports the build of image under way, if a live process
// writes its progress file.
func ReadBuildProgress(image string) (BuildProgress, bool) {
	path := BuildProgressPath(image)
	f, err := os.Open(path)
	if err != nil {
		return BuildProgress{}, false
	}
	defer func() { _ = f.Close() }() // read only
	st, err := f.Stat()
	if err != nil {
		return BuildProgress{}, false
	}
	var p BuildProgress
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if n, ok := strings.CutPrefix(line, "pid "); ok && p.PID == 0 {
			p.PID, _ = strconv.Atoi(n) // a bad number leaves 0: no live build
			continue
		}
		if line != "" {
			p.Last = line
		}
	}
	if p.PID <= 0 || syscall.Kill(p.PID, 0) != nil {
		return BuildProgress{}, false
	}
	p.Updated = st.ModTime()
	return p, true
}

// String says what the build is doing.
func (p BuildProgress) String() string {
	return fmt.Sprintf("being built by process %d: %s", p.PID, p.Last)
}
