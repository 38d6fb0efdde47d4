package jobs

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckFileName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"a.csv", true}, {"data/2024/x.csv", true}, {"é.txt", true},
		{"", false}, {"/etc/passwd", false}, {"../x", false}, {"a/../b", false}, {"a//b", false}, {"./a", false},
		{"a\x00b", false}, {"a\nb", false}, {"bad\xff", false}, {`a\b`, false}, {strings.Repeat("a", 256), false},
		{strings.Repeat("d/", 8) + "f", false},
	} {
		if err := CheckFileName(c.name); (err == nil) != c.ok {
			t.Errorf("CheckFileName(%q) = %v, want ok %v", c.name, err, c.ok)
		}
	}
}

func TestFileURI(t *testing.T) {
	for _, name := range []string{"a.csv", "sub dir/é %.png", "x/y/z"} {
		uri := FileURI("job-1", name)
		id, n, ok := ParseFileURI(uri)
		if !ok || id != "job-1" || n != name {
			t.Errorf("ParseFileURI(%q) = %q %q %v", uri, id, n, ok)
		}
	}
	for _, uri := range []string{"mcpexec://jobs/a/files/..%2Fx", "mcpexec://jobs/a/files/%2Fetc", "mcpexec://jobs/a b/files/x", "https://x/files/y", "mcpexec://jobs/a/files/%zz"} {
		if _, _, ok := ParseFileURI(uri); ok {
			t.Errorf("ParseFileURI(%q) accepted", uri)
		}
	}
}

func TestDecodeFileInputs(t *testing.T) {
	text := "a,b\n"
	out, refs, err := DecodeFileInputs([]FileInput{{Name: "a.csv", Text: &text}, {Name: "b.bin", Base64: "AAEC"}, {Name: "c.csv", URI: FileURI("j", "x.csv")}}, FileLimits{})
	if err != nil || len(out) != 3 || string(out[1].Data) != "\x00\x01\x02" || len(refs) != 1 || refs[2].URI == "" {
		t.Fatalf("%v %v %v", out, refs, err)
	}
	for _, c := range []struct {
		in    []FileInput
		field string
	}{
		{[]FileInput{{Name: "../a", Text: &text}}, "files[0].name"},
		{[]FileInput{{Name: "a", Text: &text}, {Name: "a", Text: &text}}, "files[1].name"},
		{[]FileInput{{Name: "a"}}, "files[0]"},
		{[]FileInput{{Name: "a", Text: &text, Base64: "AA=="}}, "files[0]"},
		{[]FileInput{{Name: "a", Base64: "!!"}}, "files[0].base64"},
		{[]FileInput{{Name: "a", URI: "http://x"}}, "files[0].uri"},
		{[]FileInput{{Name: "out/a", Text: &text}}, "files[0].name"},
		{[]FileInput{{Name: "a", Base64: strings.Repeat("A", 12<<20)}}, "files[0].base64"},
	} {
		_, _, err := DecodeFileInputs(c.in, FileLimits{})
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("%+v: error %v, want one naming %s", c.in, err, c.field)
		}
	}
	big := strings.Repeat("x", 100)
	if _, _, err := DecodeFileInputs([]FileInput{{Name: "a", Text: &big}, {Name: "b", Text: &big}}, FileLimits{MaxJobBytes: 150}); err == nil {
		t.Error("files over the job's bytes accepted")
	}
}
