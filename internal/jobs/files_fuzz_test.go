package jobs

import (
	"strings"
	"testing"
)

// FuzzFileNames fuzzes what callers and sandboxes name files: a name passes
// CheckFileName only when it is a relative path without '..', and its URI
// names it exactly; DecodeFileInputs accepts only such names.
func FuzzFileNames(f *testing.F) {
	for _, s := range []string{"a.csv", "d/e/f.png", "../x", "/etc/passwd", "a\x00b", "%2e%2e", "é/ü.txt", "a//b", "mcpexec://jobs/j/files/x"} {
		f.Add(s, "QUJD")
	}
	f.Fuzz(func(t *testing.T, name, b64 string) {
		if CheckFileName(name) == nil {
			if strings.HasPrefix(name, "/") || strings.Contains("/"+name+"/", "/../") || strings.ContainsRune(name, 0) {
				t.Fatalf("CheckFileName accepted %q", name)
			}
			id, got, ok := ParseFileURI(FileURI("job-1", name))
			if !ok || id != "job-1" || got != name {
				t.Fatalf("URI of %q names %q %q %v", name, id, got, ok)
			}
		}
		if _, n, ok := ParseFileURI(name); ok && CheckFileName(n) != nil {
			t.Fatalf("ParseFileURI(%q) gave the bad name %q", name, n)
		}
		out, _, err := DecodeFileInputs([]FileInput{{Name: name, Base64: b64}}, FileLimits{})
		if err == nil {
			for _, d := range out {
				if CheckFileName(d.Name) != nil {
					t.Fatalf("DecodeFileInputs accepted %q", d.Name)
				}
			}
		}
	})
}
