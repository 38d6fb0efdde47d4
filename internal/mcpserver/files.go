package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// FileURITemplate is the resource template of jobs' files.
const FileURITemplate = "mcpexec://jobs/{id}/files/{+name}"

// Bounds of the pictures one tool result carries as image content; the rest
// are resource links.
const (
	maxImages     = 8
	maxImageBytes = 12 << 20
)

// writeFiles adds the result's files and notes to its text form.
func writeFiles(b *strings.Builder, st Structured) {
	if len(st.Files) > 0 {
		b.WriteString("files:")
		for _, f := range st.Files {
			fmt.Fprintf(b, "\n  %s (%d bytes, %s) %s", f.Name, f.Size, f.MimeType, f.URI)
		}
	}
	for i, n := range st.Notes {
		if i == 0 {
			if len(st.Files) > 0 {
				b.WriteString("\n")
			}
			b.WriteString("notes:")
		}
		b.WriteString("\n  " + n)
	}
}

// attachFiles adds the job's files to a tool result: pictures as image
// content (as many as its bounds allow), the others as resource links.
func (h *handler) attachFiles(ctx context.Context, ns string, rec *jobs.Record, out *mcp.CallToolResult) {
	if rec.Result == nil || len(rec.Result.Files) == 0 {
		return
	}
	images, imageBytes := 0, int64(0)
	for _, f := range rec.Result.Files {
		uri := jobs.FileURI(rec.Job.ID, f.Name)
		if jobs.IsImage(f.MimeType) && images < maxImages && imageBytes+f.Size <= maxImageBytes {
			if data, err := readEnded(ctx, h.r, ns, rec.Job.ID, f.Name); err == nil {
				images++
				imageBytes += int64(len(data))
				out.Content = append(out.Content, mcp.NewImageContent(base64.StdEncoding.EncodeToString(data), f.MimeType))
				continue
			}
		}
		out.Content = append(out.Content, mcp.NewResourceLink(uri, f.Name, fmt.Sprintf("%d bytes written by job %s", f.Size, rec.Job.ID), f.MimeType))
	}
}

// readFile answers resources/read of a job's file, for the caller's
// namespace only: any other gets "no such job".
func (h *handler) readFile(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	uri := req.Params.URI
	id, name, ok := jobs.ParseFileURI(uri)
	if !ok {
		return nil, fmt.Errorf("%q is not a job file URI (mcpexec://jobs/{id}/files/{name})", uri)
	}
	info, data, err := h.r.File(ctx, h.namespace(ctx), id, name)
	if errs.KindOf(err) == errs.NotFound {
		return nil, fmt.Errorf("no such job or file: %s", uri)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", uri, err)
	}
	if jobs.IsText(info.MimeType) && utf8.Valid(data) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: info.MimeType, Text: string(data)}}, nil
	}
	return []mcp.ResourceContents{mcp.BlobResourceContents{URI: uri, MIMEType: info.MimeType, Blob: base64.StdEncoding.EncodeToString(data)}}, nil
}

// readEnded reads a file of a job the caller saw end: the state replica
// that answers may not have applied its end yet (the event came first), so
// "no such file" is asked again, for a few seconds at most.
func readEnded(ctx context.Context, svc jobs.Service, ns, id, name string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		_, data, err := svc.File(ctx, ns, id, name)
		if errs.KindOf(err) != errs.NotFound {
			return data, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(delay):
		}
	}
}
