package mcpserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestOversizedStdioLineIsDroppedWhole: a line over the bound is not cut to
// its start nor joined to its end (which an attacker could shape into a
// message of its own); the next line is read as it is.
func TestOversizedStdioLineIsDroppedWhole(t *testing.T) {
	const max = 1 << 10
	start := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"`
	end := `"}}` + "\n"
	in := start + strings.Repeat("a", 3*max) + end + `{"jsonrpc":"2.0","id":2,"method":"ping"}` + "\n"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	first, err := readLine(br, max)
	if err != nil || strings.Contains(string(first), "jsonrpc") || json.Valid(bytes.TrimSpace(first)) {
		t.Fatalf("oversized line read as %q, %v", first, err)
	}
	second, err := readLine(br, max)
	if err != nil || string(second) != `{"jsonrpc":"2.0","id":2,"method":"ping"}`+"\n" {
		t.Fatalf("next line: %q %v", second, err)
	}
	if _, err := readLine(br, max); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
}
