package sandbox

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// MaxNotes bounds the notes kept of one job's files.
const MaxNotes = 32

// filesOut checks the files a runner sends back for one job, whatever the
// runner is: each must have a valid name not seen before, decode, and fit the
// job's bounds; what does not is dropped with a note. Nothing it holds grows
// past the bounds.
type filesOut struct {
	l     FileLimits
	files []File
	seen  map[string]bool
	total int64
	kept  []string // notes
	over  bool     // the job sent more than MaxFiles
}

func newFilesOut(l FileLimits) *filesOut {
	return &filesOut{l: l.Or(), seen: map[string]bool{}}
}

func (o *filesOut) note(format string, args ...any) {
	switch {
	case len(o.kept) < MaxNotes:
		o.kept = append(o.kept, errs.Clip(fmt.Sprintf(format, args...), 300))
	case len(o.kept) == MaxNotes:
		o.kept = append(o.kept, "more of the job's files were not kept")
	}
}

// notes adds the runner's notes (as many as fit).
func (o *filesOut) notes(ns []string) {
	for _, n := range ns {
		if len(o.kept) >= MaxNotes {
			break
		}
		o.note("%s", strings.ToValidUTF8(n, "?"))
	}
}

func (o *filesOut) add(name, data string) {
	if err := jobs.CheckFileName(name); err != nil {
		o.note("a file of the job was not kept: %v", err)
		return
	}
	if o.seen[name] {
		o.note("out/%s was sent twice: only the first was kept", name)
		return
	}
	o.seen[name] = true
	if len(o.files) >= o.l.MaxFiles {
		if !o.over {
			o.over = true
			o.note("the job wrote more than %d files: out/%s and the rest were not kept", o.l.MaxFiles, name)
		}
		return
	}
	if int64(base64.StdEncoding.DecodedLen(len(data))) > o.l.MaxFileBytes+3 {
		o.note("out/%s is over the limit of %d bytes per file: it was not kept", name, o.l.MaxFileBytes)
		return
	}
	b, err := base64.StdEncoding.DecodeString(data)
	switch {
	case err != nil:
		o.note("out/%s came in a malformed frame: it was not kept", name)
		return
	case int64(len(b)) > o.l.MaxFileBytes:
		o.note("out/%s is %d bytes, over the limit of %d bytes per file: it was not kept", name, len(b), o.l.MaxFileBytes)
		return
	case o.total+int64(len(b)) > o.l.MaxJobBytes:
		o.note("out/%s: the files would be over %d bytes together, so it was not kept", name, o.l.MaxJobBytes)
		return
	}
	o.total += int64(len(b))
	o.files = append(o.files, File{Name: name, Data: b})
}
