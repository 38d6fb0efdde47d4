package frontend

import (
	"context"
	"errors"
	"fmt"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// stageFiles stores a prepared (wire) job's input files in the file store
// and lists them in job.Files, within namespace ns's policy: the caller's
// inline files, and files an earlier job of ns wrote, named by their URI
// (read for ns only: another namespace's are "no such job"). Errors are
// *jobs.InvalidError naming the field, or ErrUnavailable's kind.
func (f *Frontend) stageFiles(ctx context.Context, job *jobs.Job, ns string) error {
	l := f.policyFor(ns).FileLimits()
	job.FileLimits = &l
	if len(job.Files) > 0 && len(job.Inputs) == 0 {
		return f.copyInputs(ctx, job, ns)
	}
	if len(job.Files) > 0 {
		return &jobs.InvalidError{Field: "input_files", Message: "input files are listed by the front-end: give files instead"}
	}
	if len(job.Inputs) == 0 {
		return nil
	}
	files, refs, err := jobs.DecodeFileInputs(job.Inputs, l)
	if err != nil {
		return err
	}
	var total int64
	for i, in := range refs {
		id, name, _ := jobs.ParseFileURI(in.URI) // DecodeFileInputs checked it
		_, data, err := f.state.File(ctx, ns, jobs.ScopedID(ns, id), name)
		switch {
		case errors.Is(err, state.ErrNotFound):
			return &jobs.InvalidError{Field: fmt.Sprintf("files[%d].uri", i), Message: fmt.Sprintf("%s: no such job or file in this namespace", in.URI)}
		case err != nil:
			return fmt.Errorf("%w: read %s: %w", ErrUnavailable, in.URI, err)
		case int64(len(data)) > l.MaxFileBytes:
			return &jobs.InvalidError{Field: fmt.Sprintf("files[%d].uri", i), Message: fmt.Sprintf("%s is %d bytes, over the limit of %d bytes per file", in.URI, len(data), l.MaxFileBytes)}
		}
		files[i].Data = data
	}
	infos := make([]jobs.FileInfo, 0, len(files))
	for i, file := range files {
		if total += int64(len(file.Data)); total > l.MaxJobBytes {
			return &jobs.InvalidError{Field: "files", Message: fmt.Sprintf("the files are over %d bytes together", l.MaxJobBytes)}
		}
		info, err := f.state.PutFile(ctx, state.FilePut{Job: job.ID, Capability: jobs.Capability(f.key, job.ID), Name: file.Name,
			Namespace: ns, QuotaBytes: l.QuotaBytes}, file.Data)
		switch {
		case errors.Is(err, state.ErrInvalid):
			return &jobs.InvalidError{Field: fmt.Sprintf("files[%d]", i), Message: err.Error()}
		case err != nil:
			return fmt.Errorf("%w: store input file %s: %w", ErrUnavailable, file.Name, err)
		}
		infos = append(infos, info)
	}
	job.Files, job.Inputs = infos, nil
	return job.CheckFiles()
}

// copyInputs stores a re-run's input files (job.Files, its parent's) under
// its own id, read from the parent (job.RetryOf) within namespace ns.
func (f *Frontend) copyInputs(ctx context.Context, job *jobs.Job, ns string) error {
	if job.RetryOf == "" {
		return &jobs.InvalidError{Field: "input_files", Message: "input files are listed by the front-end: give files instead"}
	}
	infos := make([]jobs.FileInfo, 0, len(job.Files))
	for _, in := range job.Files {
		data, err := f.state.InputOf(ctx, ns, job.RetryOf, in.Name)
		if errors.Is(err, state.ErrNotFound) {
			return &jobs.InvalidError{Field: "input_files", Message: fmt.Sprintf("input file %s of job %s has expired: submit the job again with its files", in.Name, job.RetryOf)}
		}
		if err != nil {
			return fmt.Errorf("%w: read input file %s of job %s: %w", ErrUnavailable, in.Name, job.RetryOf, err)
		}
		info, err := f.state.PutFile(ctx, state.FilePut{Job: job.ID, Capability: jobs.Capability(f.key, job.ID), Name: in.Name,
			Namespace: ns, QuotaBytes: job.FileLimits.QuotaBytes}, data)
		if err != nil {
			return fmt.Errorf("%w: store input file %s: %w", ErrUnavailable, in.Name, err)
		}
		infos = append(infos, info)
	}
	job.Files = infos
	return job.CheckFiles()
}

// File returns file name that job id (the namespace's own id) wrote, for
// namespace ns; ErrNotFound's kind when ns has no such job or file.
func (f *Frontend) File(ctx context.Context, ns, id, name string) (jobs.FileInfo, []byte, error) {
	ns = jobs.NamespaceOf(ns)
	if !jobs.ValidUserID(id) || jobs.CheckFileName(name) != nil {
		return jobs.FileInfo{}, nil, fmt.Errorf("%w: no such job", state.ErrNoSuchFile)
	}
	return f.state.File(ctx, ns, jobs.ScopedID(ns, id), name)
}
