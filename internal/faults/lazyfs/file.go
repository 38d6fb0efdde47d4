package lazyfs

// An open file's reads and writes, through the changes not yet synced.

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func (p *pending) truncate(size int64) {
	p.mtime = time.Now()
	if size < p.size && (p.trunc < 0 || size < p.trunc) {
		p.trunc = size
	}
	p.size = size
	kept := p.writes[:0]
	for _, w := range p.writes {
		if w.off >= size {
			continue
		}
		if end := w.off + int64(len(w.data)); end > size {
			w.data = w.data[:size-w.off]
		}
		kept = append(kept, w)
	}
	p.writes = kept
}

func (p *pending) write(data []byte, off int64) {
	p.mtime = time.Now()
	if n := len(p.writes); n > 0 {
		last := &p.writes[n-1]
		if last.off+int64(len(last.data)) == off {
			last.data = append(last.data, data...)
			p.size = max(p.size, off+int64(len(data)))
			return
		}
	}
	p.writes = append(p.writes, extent{off: off, data: append([]byte(nil), data...)})
	p.size = max(p.size, off+int64(len(data)))
}

// read fills buf from offset off of the file as it is with p's changes on
// top of the backing file fd; it returns how many bytes the file has there.
func (p *pending) read(fd int, buf []byte, off int64) (int, error) {
	if off >= p.size {
		return 0, nil
	}
	buf = buf[:min(int64(len(buf)), p.size-off)]
	clear(buf)
	limit := int64(len(buf))
	if p.trunc >= 0 {
		limit = min(limit, max(p.trunc-off, 0))
	}
	for done := int64(0); done < limit; {
		n, err := syscall.Pread(fd, buf[done:limit], off+done)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		done += int64(n)
	}
	for _, w := range p.writes {
		lo, hi := max(w.off, off), min(w.off+int64(len(w.data)), off+int64(len(buf)))
		if lo < hi {
			copy(buf[lo-off:hi-off], w.data[lo-w.off:hi-w.off])
		}
	}
	return len(buf), nil
}

// flush writes p's changes to the backing file fd.
func (p *pending) flush(fd int) error {
	if p.trunc >= 0 {
		if err := syscall.Ftruncate(fd, p.trunc); err != nil {
			return err
		}
	}
	for _, w := range p.writes {
		for done := 0; done < len(w.data); {
			n, err := syscall.Pwrite(fd, w.data[done:], w.off+int64(done))
			if err != nil {
				return err
			}
			done += n
		}
	}
	return syscall.Ftruncate(fd, p.size)
}

// file is an open file: its reads and writes go through the pending changes.
type file struct {
	fs   *FS
	fd   int
	key  fileKey
	path string // in the backing dir, when opened
}

var (
	_ fs.FileReader    = (*file)(nil)
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileFsyncer   = (*file)(nil)
	_ fs.FileFlusher   = (*file)(nil)
	_ fs.FileReleaser  = (*file)(nil)
	_ fs.FileGetattrer = (*file)(nil)
)

func (f *FS) newFile(fd int, path string, trunc bool) (fs.FileHandle, uint32, syscall.Errno) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		_ = syscall.Close(fd) // failed open: nothing written
		return nil, 0, fs.ToErrno(err)
	}
	h := &file{fs: f, fd: fd, key: keyOf(&st), path: path}
	if trunc {
		if e := f.truncate(fd, path, 0); e != 0 {
			_ = syscall.Close(fd) // failed open: nothing written
			return nil, 0, e
		}
	}
	// The kernel must ask for every read: its cache would outlive a cut.
	return h, fuse.FOPEN_DIRECT_IO, 0
}

func (h *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if e := h.fs.check(); e != 0 {
		return nil, e
	}
	p := h.fs.pending[h.key]
	if p == nil {
		n, err := syscall.Pread(h.fd, buf, off)
		if err != nil {
			return nil, fs.ToErrno(err)
		}
		return fuse.ReadResultData(buf[:n]), 0
	}
	n, err := p.read(h.fd, buf, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return fuse.ReadResultData(buf[:n]), 0
}

func (h *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if e := h.fs.check(); e != 0 {
		return 0, e
	}
	p, e := h.fs.get(h.key, h.fd, h.path, true)
	if e != 0 {
		return 0, e
	}
	p.write(data, off)
	return uint32(len(data)), 0
}

func (h *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if e := h.fs.check(); e != 0 {
		return e
	}
	p := h.fs.pending[h.key]
	if p == nil {
		return 0
	}
	if err := p.flush(h.fd); err != nil {
		return fs.ToErrno(err)
	}
	delete(h.fs.pending, h.key)
	return 0
}

// Flush is close(2): it syncs nothing.
func (h *file) Flush(ctx context.Context) syscall.Errno { return h.fs.ok() }

func (h *file) Release(ctx context.Context) syscall.Errno {
	if err := syscall.Close(h.fd); err != nil {
		return fs.ToErrno(err)
	}
	return 0
}

func (h *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(h.fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	out.FromStat(&st)
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if e := h.fs.check(); e != 0 {
		return e
	}
	if p := h.fs.pending[h.key]; p != nil {
		out.Size = uint64(p.size)
		out.SetTimes(nil, &p.mtime, nil)
	}
	return 0
}
