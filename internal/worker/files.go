package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/state"
)

// storeFilesWait bounds the storing of one attempt's files: a state service
// that does not answer costs the result its files (each noted), not the
// result itself.
const storeFilesWait = 2 * time.Minute

// inputFiles reads the job's input files from the file store (with its
// capability) and checks each against what the job message says of it.
// A file that is gone or not what the job names fails the job (err is
// ErrInvalid's kind); an unreachable store is transient.
func (w *Worker) inputFiles(ctx context.Context, d *delivery) ([]sandbox.File, error) {
	if len(d.job.Files) == 0 {
		return nil, nil
	}
	out := make([]sandbox.File, 0, len(d.job.Files))
	for _, f := range d.job.Files {
		data, err := w.state.InputFile(ctx, d.job.ID, d.capability, f.Name)
		if err != nil {
			return nil, fmt.Errorf("input file %s: %w", f.Name, err)
		}
		sum := sha256.Sum256(data)
		if int64(len(data)) != f.Size || (f.SHA256 != "" && hex.EncodeToString(sum[:]) != f.SHA256) {
			return nil, fmt.Errorf("input file %s: %w: the stored bytes are not the ones submitted", f.Name, state.ErrInvalid)
		}
		out = append(out, sandbox.File{Name: f.Name, Data: data})
	}
	return out, nil
}

// inputsFailed reports whether err (from inputFiles) fails the job rather
// than being worth another delivery.
func inputsFailed(err error) bool {
	return errors.Is(err, state.ErrInvalid) || errors.Is(err, state.ErrNotFound)
}

// storeFiles puts what the attempt wrote in the file store and returns what
// was kept, and notes for the rest (after the runner's own). Everything the
// sandbox sent is checked again here against the job's limits, with fixed
// bounds, before anything is stored.
func (w *Worker) storeFiles(ctx context.Context, d *delivery, attempt int, res sandbox.Result) ([]jobs.FileInfo, []string) {
	notes := append([]string(nil), res.Notes...)
	if len(notes) > sandbox.MaxNotes+1 {
		notes = notes[:sandbox.MaxNotes+1]
	}
	note := func(format string, args ...any) {
		if len(notes) <= sandbox.MaxNotes {
			notes = append(notes, fmt.Sprintf(format, args...))
		}
	}
	l := d.job.FilesLimits()
	var kept []jobs.FileInfo
	var total int64
	seen := map[string]bool{}
	for _, f := range res.Files {
		switch {
		case jobs.CheckFileName(f.Name) != nil:
			note("a file with a bad name was not kept")
			continue
		case seen[f.Name]:
			note("out/%s came twice: it was kept once", f.Name)
			continue
		case len(kept) >= l.MaxFiles:
			note("out/%s: over %d files, not kept", f.Name, l.MaxFiles)
			continue
		case int64(len(f.Data)) > l.MaxFileBytes:
			note("out/%s is %d bytes, over the limit of %d bytes per file: it was not kept", f.Name, len(f.Data), l.MaxFileBytes)
			continue
		case total+int64(len(f.Data)) > l.MaxJobBytes:
			note("out/%s: the files would be over %d bytes together, so it was not kept", f.Name, l.MaxJobBytes)
			continue
		}
		seen[f.Name] = true
		info, err := w.state.PutFile(ctx, state.FilePut{Job: d.job.ID, Capability: d.capability, Attempt: attempt, Name: f.Name}, f.Data)
		if err != nil {
			note("out/%s was not kept: %v", f.Name, err)
			continue
		}
		total += info.Size
		kept = append(kept, info)
	}
	return kept, notes
}
