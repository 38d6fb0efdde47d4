package jobs

import (
	"encoding/base64"
	"fmt"
	"mime"
	"net/http"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mcpexec/mcpexec/internal/errs"
)

// Files go in and out of a job beside its code. A caller gives a job input
// files (FileInput: text, base64 or the URI of a file an earlier job of its
// namespace wrote); the front-end stores their bytes in the file store and
// the job carries only their names and sizes (Job.Files), so job messages
// stay small. What the code writes under /workspace/out comes back as the
// result's Files, each stored in the file store too. Names are checked
// wherever they are received (CheckFileName) and sizes against FileLimits.

// FileInput is one input file as a caller gives it: exactly one of Text,
// Base64 and URI.
type FileInput struct {
	Name   string  `json:"name"`
	Text   *string `json:"text,omitempty"`
	Base64 string  `json:"base64,omitempty"`
	URI    string  `json:"uri,omitempty"`
}

// FileInfo describes one stored file: an input of a job (Job.Files) or one it
// wrote (Result.Files).
type FileInfo struct {
	Name     string `json:"name"`
	Size     int64  `json:"size"`
	MimeType string `json:"mimeType,omitempty"`
	// SHA256 is the hex digest of the bytes: what a reader checks the
	// stored bytes against.
	SHA256 string `json:"sha256,omitempty"`
}

// FileLimits bound a job's files. The front-end sets them from the
// namespace's policy; they travel in the job (signed) so that the worker and
// the state service hold the job to them.
type FileLimits struct {
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"` // one file
	MaxJobBytes  int64 `json:"max_job_bytes,omitempty"`  // all files in, or all out, of one job
	MaxFiles     int   `json:"max_files,omitempty"`      // files in, or out, of one job
	// QuotaBytes caps what the namespace's files hold in the file store (its
	// policy's files_bytes); 0: no quota.
	QuotaBytes int64 `json:"quota_bytes,omitempty"`
}

// Fixed bounds of files, whatever a policy says: a file travels in one
// runner frame (16 MiB, base64) and one NATS message (24 MiB).
const (
	HardMaxFileBytes  = 10 << 20
	HardMaxJobBytes   = 256 << 20
	HardMaxFiles      = 1000
	MaxFileNameBytes  = 255
	MaxFileNameDepth  = 8
	DefaultFileBytes  = 8 << 20
	DefaultJobBytes   = 32 << 20
	DefaultFilesCount = 100
)

// DefaultFileLimits are the limits of a namespace whose policy sets none.
func DefaultFileLimits() FileLimits {
	return FileLimits{MaxFileBytes: DefaultFileBytes, MaxJobBytes: DefaultJobBytes, MaxFiles: DefaultFilesCount}
}

// Or returns l with its zero fields taken from DefaultFileLimits, and every
// field held to the hard bounds.
func (l FileLimits) Or() FileLimits {
	d := DefaultFileLimits()
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxJobBytes <= 0 {
		l.MaxJobBytes = d.MaxJobBytes
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = d.MaxFiles
	}
	l.MaxFileBytes = min(l.MaxFileBytes, HardMaxFileBytes)
	l.MaxJobBytes = min(l.MaxJobBytes, HardMaxJobBytes)
	l.MaxFiles = min(l.MaxFiles, HardMaxFiles)
	return l
}

// CheckFileName reports what is wrong with name as a file's name under
// /workspace (nil when nothing): a relative path of at most MaxFileNameDepth
// parts, valid UTF-8 of at most MaxFileNameBytes bytes, without control
// characters, backslashes, empty, "." or ".." parts.
func CheckFileName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("the name is empty")
	case len(name) > MaxFileNameBytes:
		return fmt.Errorf("the name is %d bytes, over %d", len(name), MaxFileNameBytes)
	case !utf8.ValidString(name):
		return fmt.Errorf("the name %q is not valid UTF-8", name)
	case strings.HasPrefix(name, "/"):
		return fmt.Errorf("the name %q is absolute: give a path relative to /workspace", name)
	case strings.ContainsRune(name, '\\'):
		return fmt.Errorf("the name %q holds a backslash: separate directories with '/'", name)
	}
	for _, r := range name {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return fmt.Errorf("the name %q holds a control character", name)
		}
	}
	parts := strings.Split(name, "/")
	if len(parts) > MaxFileNameDepth {
		return fmt.Errorf("the name %q is %d directories deep, over %d", name, len(parts), MaxFileNameDepth)
	}
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return fmt.Errorf("the name %q has an empty, '.' or '..' part", name)
		}
	}
	return nil
}

// FileURIPrefix starts every file URI.
const FileURIPrefix = "mcpexec://jobs/"

// FileURI returns the URI of file name of job id (the caller's id).
func FileURI(id, name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = escapePathPart(p)
	}
	return FileURIPrefix + id + "/files/" + strings.Join(parts, "/")
}

func escapePathPart(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// ParseFileURI returns the job id (the caller's) and file name a file URI
// names, and whether it is one.
func ParseFileURI(uri string) (id, name string, ok bool) {
	rest, ok := strings.CutPrefix(uri, FileURIPrefix)
	if !ok {
		return "", "", false
	}
	id, escaped, ok := strings.Cut(rest, "/files/")
	if !ok || !ValidUserID(id) {
		return "", "", false
	}
	parts := strings.Split(escaped, "/")
	for i, p := range parts {
		u, err := unescapePathPart(p)
		if err != nil {
			return "", "", false
		}
		parts[i] = u
	}
	name = strings.Join(parts, "/")
	if CheckFileName(name) != nil {
		return "", "", false
	}
	return id, name, true
}

func unescapePathPart(p string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] != '%' {
			b.WriteByte(p[i])
			continue
		}
		if i+2 >= len(p) {
			return "", fmt.Errorf("bad escape")
		}
		var c byte
		if _, err := fmt.Sscanf(p[i+1:i+3], "%02X", &c); err != nil {
			return "", err
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), nil
}

// Image types an MCP client is shown as pictures.
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// IsImage reports whether mimeType is a picture type shown as MCP image content.
func IsImage(mimeType string) bool { return imageTypes[mimeType] }

// SniffMimeType returns the media type of a file from its bytes: an image
// type only when the bytes are that image (never from the name alone, which
// the sandbox chooses), else the type its extension names, else text/plain
// for UTF-8 text and application/octet-stream for the rest.
func SniffMimeType(name string, data []byte) string {
	if t := http.DetectContentType(data); IsImage(t) {
		return t
	}
	ext := strings.ToLower(path.Ext(name))
	switch ext {
	case ".csv":
		return "text/csv"
	case ".json":
		return "application/json"
	case ".md":
		return "text/markdown"
	case ".txt", ".log":
		return "text/plain"
	}
	if t := mime.TypeByExtension(ext); t != "" && !IsImage(baseType(t)) && !strings.HasPrefix(t, "text/html") {
		return baseType(t)
	}
	if utf8.Valid(data) {
		return "text/plain"
	}
	return "application/octet-stream"
}

func baseType(t string) string {
	if i := strings.IndexByte(t, ';'); i >= 0 {
		return strings.TrimSpace(t[:i])
	}
	return t
}

// IsText reports whether a file of mimeType is read back as text.
func IsText(mimeType string) bool {
	return strings.HasPrefix(mimeType, "text/") || mimeType == "application/json"
}

// DecodedFile is one input file's name and bytes, once decoded.
type DecodedFile struct {
	Name string
	Data []byte
}

// DecodeFileInputs checks the caller's input files against l and decodes
// those given inline; ones given by URI are returned in refs (index into
// out, whose Data the caller fills). Errors are *InvalidError naming the
// field ("files[2].name").
func DecodeFileInputs(in []FileInput, l FileLimits) (out []DecodedFile, refs map[int]FileInput, err error) {
	l = l.Or()
	if len(in) > l.MaxFiles {
		return nil, nil, invalid("files", "%d files given, at most %d allowed", len(in), l.MaxFiles)
	}
	seen := map[string]bool{}
	var total int64
	for i, f := range in {
		field := fmt.Sprintf("files[%d]", i)
		if err := CheckFileName(f.Name); err != nil {
			return nil, nil, invalid(field+".name", "%v", err)
		}
		if strings.HasPrefix(f.Name, "out/") || f.Name == "out" {
			return nil, nil, invalid(field+".name", "%q is under out/, where the job's own files go: choose another name", f.Name)
		}
		if seen[f.Name] {
			return nil, nil, invalid(field+".name", "%q is given twice", f.Name)
		}
		seen[f.Name] = true
		n := 0
		if f.Text != nil {
			n++
		}
		if f.Base64 != "" {
			n++
		}
		if f.URI != "" {
			n++
		}
		if n != 1 {
			return nil, nil, invalid(field, "give exactly one of text, base64 and uri")
		}
		var data []byte
		switch {
		case f.Text != nil:
			data = []byte(*f.Text)
		case f.Base64 != "":
			if int64(base64.StdEncoding.DecodedLen(len(f.Base64))) > l.MaxFileBytes+3 {
				return nil, nil, invalid(field+".base64", "the file is over %d bytes", l.MaxFileBytes)
			}
			data, err = base64.StdEncoding.DecodeString(f.Base64)
			if err != nil {
				return nil, nil, invalid(field+".base64", "not standard base64: %v", err)
			}
		default:
			if _, _, ok := ParseFileURI(f.URI); !ok {
				return nil, nil, invalid(field+".uri", "%q is not a file URI (mcpexec://jobs/{job id}/files/{name})", errs.Clip(f.URI, 80))
			}
			if refs == nil {
				refs = map[int]FileInput{}
			}
			refs[i] = f
		}
		if int64(len(data)) > l.MaxFileBytes {
			return nil, nil, invalid(field, "the file is %d bytes, over the limit of %d bytes", len(data), l.MaxFileBytes)
		}
		if total += int64(len(data)); total > l.MaxJobBytes {
			return nil, nil, invalid("files", "the files are over %d bytes together", l.MaxJobBytes)
		}
		out = append(out, DecodedFile{Name: f.Name, Data: data})
	}
	return out, refs, nil
}

// FilesBytes returns the bytes the files hold together.
func FilesBytes(fs []FileInfo) int64 {
	var n int64
	for _, f := range fs {
		n += f.Size
	}
	return n
}

// StoredBytes returns what rec's files hold in the file store: its inputs
// and the outputs of its result.
func (r *Record) StoredBytes() int64 {
	n := FilesBytes(r.Job.Files)
	if r.Result != nil {
		n += FilesBytes(r.Result.Files)
	}
	return n
}
