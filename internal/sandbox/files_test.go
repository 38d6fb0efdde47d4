package sandbox_test

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// TestDriveChecksFilesOut plays a hostile runner that sends file frames the
// supervisor would never send: bad names, duplicates, malformed data, more
// files and bytes than the job's bounds, notes that are not UTF-8. The host
// keeps only what passes, notes the rest, and stays bounded.
func TestDriveChecksFilesOut(t *testing.T) {
	rc, fr := setup(t, 0)
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	res := drive(t, rc, fr, func() {
		send := func(name, data string) {
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeFile, Job: "j", Name: name, Data: data})
		}
		send("ok.txt", b64("fine"))
		send("ok.txt", b64("again"))
		send("../../etc/passwd", b64("x"))
		send("/abs", b64("x"))
		send("a\x00b", b64("x"))
		send("bad\xff", b64("x"))
		send("notb64", "!!!")
		send("big", b64(strings.Repeat("x", 9<<20)))
		for i := range 200 {
			send(fmt.Sprintf("n%d", i), b64("y"))
		}
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeFile, Job: "other", Name: "late.txt", Data: b64("another job's")})
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success", Notes: []string{"runner note \xff"}})
	})
	if res.Status != sandbox.StatusSuccess {
		t.Fatalf("status %s", res.Status)
	}
	if len(res.Files) != sandbox.DefaultFileLimits().MaxFiles {
		t.Fatalf("%d files kept, want the limit %d", len(res.Files), sandbox.DefaultFileLimits().MaxFiles)
	}
	if res.Files[0].Name != "ok.txt" || string(res.Files[0].Data) != "fine" {
		t.Fatalf("first file %q %q", res.Files[0].Name, res.Files[0].Data)
	}
	for _, f := range res.Files {
		if f.Name == "late.txt" || strings.Contains(f.Name, "..") || f.Name == "big" {
			t.Fatalf("kept %q", f.Name)
		}
	}
	if len(res.Notes) > sandbox.MaxNotes+1 {
		t.Fatalf("%d notes", len(res.Notes))
	}
	all := strings.Join(res.Notes, "\n")
	for _, want := range []string{"sent twice", "'..'", "absolute", "control character", "bad�", "malformed", "over the limit", "more than 100 files"} {
		if !strings.Contains(all, want) {
			t.Errorf("no note says %q: %q", want, res.Notes)
		}
	}
}

// TestDriveSendsFilesIn checks that input files go to the runner before the
// exec frame, and that a bad input name is refused before anything is sent.
func TestDriveSendsFilesIn(t *testing.T) {
	rc, fr := setup(t, 0)
	res, err := rc.Drive(t.Context(), sandbox.Job{ID: "j", Code: "x", Files: []sandbox.File{{Name: "../x", Data: []byte("1")}}}, nil)
	if err != nil || res.Status != sandbox.StatusError || !strings.Contains(res.Error, "input file") || !rc.Reusable() {
		t.Fatalf("bad input name: %v %+v reusable %v", err, res, rc.Reusable())
	}
	got := make(chan []*proxy.Frame, 1)
	go func() {
		var fs []*proxy.Frame
		for {
			f, err := fr.r.Read()
			if err != nil {
				break
			}
			fs = append(fs, f)
			if f.Type == proxy.TypeExec {
				_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "success"})
				break
			}
		}
		got <- fs
	}()
	if _, err := rc.Drive(t.Context(), sandbox.Job{ID: "j", Code: "x", Files: []sandbox.File{{Name: "d/a.csv", Data: []byte("1,2")}}}, nil); err != nil {
		t.Fatal(err)
	}
	fs := <-got
	if len(fs) != 2 || fs[0].Type != proxy.TypeFile || fs[0].Name != "d/a.csv" || fs[0].Data != base64.StdEncoding.EncodeToString([]byte("1,2")) || fs[1].Type != proxy.TypeExec || fs[1].MaxFiles != 100 {
		t.Fatalf("frames %+v", fs)
	}
}
