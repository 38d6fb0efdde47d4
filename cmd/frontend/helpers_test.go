package main

import (
	"io"
	"os"
	"testing"

	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
)

// podmanConfigForProbe opens a throwaway runtime only to learn whether Podman and
// the image are there.
func podmanConfigForProbe() podman.Config { return podman.Config{} }

func testLogWriter(t *testing.T) io.Writer {
	if testing.Verbose() {
		return os.Stderr
	}
	return io.Discard
}
