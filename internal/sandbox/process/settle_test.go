package process_test

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// TestSettleGivesTheHeapBack: a zygote settles before its first fork
// (_settle), giving the C heap's free pages back, since each fork copies,
// and each exit tears down, a page table entry for every page it maps. Here
// 20 MB freed below a live object (which keeps free() from trimming the
// heap's top itself) must leave the process's resident memory.
func TestSettleGivesTheHeapBack(t *testing.T) {
	dir := t.TempDir()
	if err := sandbox.WriteRunner(dir); err != nil {
		t.Fatal(err)
	}
	script := `import sys
sys.path.insert(0, sys.argv[1])
import mcpexec_protocol

def anon():
    return int([l for l in open("/proc/self/status") if l.startswith("RssAnon:")][0].split()[1])

held = [bytes(4000) for _ in range(5000)]
keep = bytes(4000)
del held
before = anon()
mcpexec_protocol._settle()
print(before, anon())
`
	out, err := exec.Command("python3", "-I", "-B", "-c", script, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("output %q", out)
	}
	before, err1 := strconv.Atoi(f[0])
	after, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		t.Fatalf("output %q", out)
	}
	if before-after < 15<<10 {
		t.Fatalf("anonymous memory %d kB before the settle, %d kB after: want the 20 MB freed given back", before, after)
	}
}
