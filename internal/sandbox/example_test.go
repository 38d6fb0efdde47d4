package sandbox_test

import (
	"fmt"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Every runtime enforces the same limits unless configured otherwise: 512 MiB
// of memory, 128 processes, one CPU, 64 MiB tmpfs, user nobody.
func ExampleDefaultLimits() {
	l := sandbox.DefaultLimits()
	fmt.Println(l.Memory>>20, l.Pids, l.CPUs, l.TmpfsSize>>20, l.User)
	// Output: 512 128 1 64 65534:65534
}
