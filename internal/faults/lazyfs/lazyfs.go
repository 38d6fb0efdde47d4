package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is a mounted lazy file system.
type FS struct {
	dir, backing string
	server       *fuse.Server

	mu      sync.Mutex // guards the fields below
	state   state
	pending map[fileKey]*pending
	cuts    int // unsynced writes dropped by Cut, over the FS's life
}

type state int

const (
	running state = iota
	frozen        // killed process: every operation fails, unsynced data kept
	dead          // power cut: every operation fails, unsynced data gone
)

// fileKey names a backing file whatever its path (renames keep it).
type fileKey struct{ dev, ino uint64 }

// pending is one file's unsynced changes: its logical size, the size it was
// truncated to (backing bytes at and beyond it read as zeros; -1: none), and
// the writes since the last fsync, in order.
type pending struct {
	path   string    // where the file was when first written since its sync
	mtime  time.Time // of the last change: the file's, as a disk's would say
	size   int64
	trunc  int64
	writes []extent
}

type extent struct {
	off  int64
	data []byte
}

// Mount mounts a lazy file system at dir that stores its files in backing
// (both directories must exist). Unmount it when done.
func Mount(dir, backing string) (*FS, error) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("lazyfs needs FUSE: %w (load the fuse module, or run the test where /dev/fuse exists)", err)
	}
	lfs := &FS{dir: dir, backing: backing, pending: map[fileKey]*pending{}}
	loop, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("lazyfs backing dir %s: %w", backing, err)
	}
	rootNode := &node{LoopbackNode: loop.(*fs.LoopbackNode), fs: lfs}
	zero := time.Duration(0)
	server, err := fs.Mount(dir, rootNode, &fs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "lazyfs", Name: "lazyfs", DirectMount: true, MaxBackground: 64},
	})
	if err != nil {
		return nil, fmt.Errorf("mount lazyfs at %s: %w", dir, err)
	}
	lfs.server = server
	return lfs, nil
}

// Dir is where the file system is mounted.
func (f *FS) Dir() string { return f.dir }

// Backing is the directory that holds what was synced.
func (f *FS) Backing() string { return f.backing }

// Cut cuts the power: every unsynced write and truncate is dropped and every
// later operation fails with EIO, until the file system is unmounted and
// mounted again. It returns how many unsynced writes it dropped.
func (f *FS) Cut() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, p := range f.pending {
		n += len(p.writes)
	}
	f.cuts += n
	f.pending = map[fileKey]*pending{}
	f.state = dead
	return n
}

// Freeze makes every operation fail with EIO and keeps what is unsynced, as
// when the process using the files is killed: call it just before stopping
// an in-process server, so nothing it does while stopping reaches the files.
func (f *FS) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == running {
		f.state = frozen
	}
}

// Thaw undoes Freeze: the next process sees what the killed one had written.
func (f *FS) Thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == frozen {
		f.state = running
	}
}

// Unsynced is the number of writes not yet synced.
func (f *FS) Unsynced() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, p := range f.pending {
		n += len(p.writes)
	}
	return n
}

// UnsyncedFiles is the number of unsynced writes of each file that has
// some, by its path relative to the mount when it was first written.
func (f *FS) UnsyncedFiles() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for _, p := range f.pending {
		out[p.path] += len(p.writes)
	}
	return out
}

// Unmount unmounts the file system; after a Cut, what was unsynced is gone
// for good. It retries while the mount is busy, then detaches it lazily.
func (f *FS) Unmount() error {
	var err error
	for range 20 {
		if err = f.server.Unmount(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out, lerr := exec.Command("umount", "-l", f.dir).CombinedOutput(); lerr != nil {
		return fmt.Errorf("unmount lazyfs %s: %w; lazy unmount: %w: %s", f.dir, err, lerr, out)
	}
	return nil
}

// check fails an operation while the file system is frozen or dead.
// f.mu must be held.
func (f *FS) check() syscall.Errno {
	if f.state != running {
		return syscall.EIO
	}
	return 0
}

func (f *FS) ok() syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.check()
}

// drop forgets the unsynced changes of a file that is gone.
func (f *FS) drop(k fileKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pending, k)
}

// get returns k's pending changes, creating them (at the backing size of
// fd) when create is set; f.mu must be held.
func (f *FS) get(k fileKey, fd int, path string, create bool) (*pending, syscall.Errno) {
	if p := f.pending[k]; p != nil || !create {
		return p, 0
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fs.ToErrno(err)
	}
	rel, _ := filepath.Rel(f.backing, path)
	p := &pending{path: rel, size: st.Size, trunc: -1}
	f.pending[k] = p
	return p, 0
}

func keyOf(st *syscall.Stat_t) fileKey { return fileKey{uint64(st.Dev), st.Ino} }

// node is a loopback node whose files keep unsynced changes in memory.
type node struct {
	*fs.LoopbackNode
	fs *FS
}

// WrapChild makes every node of the tree a lazy one.
func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fs: n.fs}
}

var (
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeGetattrer   = (*node)(nil)
	_ fs.NodeSetattrer   = (*node)(nil)
	_ fs.NodeStatxer     = (*node)(nil)
	_ fs.NodeUnlinker    = (*node)(nil)
	_ fs.NodeRenamer     = (*node)(nil)
	_ fs.NodeLookuper    = (*node)(nil)
	_ fs.NodeMkdirer     = (*node)(nil)
	_ fs.NodeRmdirer     = (*node)(nil)
	_ fs.NodeWrapChilder = (*node)(nil)
)

func (n *node) path() string {
	return filepath.Join(n.RootData.Path, n.Path(n.Root()))
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.fs.ok(); e != 0 {
		return nil, e
	}
	ch, e := n.LoopbackNode.Lookup(ctx, name, out)
	if e == 0 {
		n.fs.fixSize(filepath.Join(n.path(), name), &out.Attr)
	}
	return ch, e
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.fs.ok(); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if e := n.fs.ok(); e != 0 {
		return e
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if e := n.fs.ok(); e != 0 {
		return e
	}
	p := filepath.Join(n.path(), name)
	var st syscall.Stat_t
	gone := syscall.Lstat(p, &st) == nil && st.Nlink <= 1
	if e := n.LoopbackNode.Unlink(ctx, name); e != 0 {
		return e
	}
	if gone {
		n.fs.drop(keyOf(&st))
	}
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if e := n.fs.ok(); e != 0 {
		return e
	}
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	var st syscall.Stat_t
	replaced := flags == 0 && syscall.Lstat(filepath.Join(np.path(), newName), &st) == nil && st.Nlink <= 1
	if e := n.LoopbackNode.Rename(ctx, name, np, newName, flags); e != 0 {
		return e
	}
	if replaced {
		n.fs.drop(keyOf(&st))
	}
	return 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if e := n.fs.ok(); e != 0 {
		return nil, 0, e
	}
	trunc := flags&syscall.O_TRUNC != 0
	flags &^= syscall.O_APPEND | syscall.O_TRUNC | fuse.FMODE_EXEC
	fd, err := syscall.Open(n.path(), int(flags)|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fs.ToErrno(err)
	}
	return n.fs.newFile(fd, n.path(), trunc)
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := n.fs.ok(); e != 0 {
		return nil, nil, 0, e
	}
	trunc := flags&syscall.O_TRUNC != 0
	flags &^= syscall.O_APPEND | syscall.O_TRUNC
	ch, lfh, _, e := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	// The loopback handle owns a descriptor; take our own and let it go.
	fd, err := syscall.Open(filepath.Join(n.path(), name), int(flags&^(syscall.O_CREAT|syscall.O_EXCL))|syscall.O_CLOEXEC, 0)
	if rel, ok := lfh.(fs.FileReleaser); ok {
		_ = rel.Release(ctx) // a duplicate descriptor of a file just created: nothing written through it
	}
	if err != nil {
		return nil, nil, 0, fs.ToErrno(err)
	}
	fh, _, e := n.fs.newFile(fd, filepath.Join(n.path(), name), trunc)
	if e != 0 {
		return nil, nil, 0, e
	}
	if trunc {
		out.Size = 0
	}
	return ch, fh, 0, 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if e := n.fs.ok(); e != 0 {
		return e
	}
	if e := n.LoopbackNode.Getattr(ctx, nil, out); e != 0 {
		return e
	}
	n.fs.fixSize(n.path(), &out.Attr)
	return 0
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if e := n.fs.ok(); e != 0 {
		return e
	}
	if e := n.LoopbackNode.Statx(ctx, nil, flags, mask, out); e != 0 {
		return e
	}
	var st syscall.Stat_t
	if syscall.Lstat(n.path(), &st) == nil {
		n.fs.mu.Lock()
		if p := n.fs.pending[keyOf(&st)]; p != nil {
			out.Size = uint64(p.size)
			out.Mtime = fuse.SxTime{Sec: uint64(p.mtime.Unix()), Nsec: uint32(p.mtime.Nanosecond())}
		}
		n.fs.mu.Unlock()
	}
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if e := n.fs.ok(); e != 0 {
		return e
	}
	if sz, ok := in.GetSize(); ok {
		fd, err := syscall.Open(n.path(), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return fs.ToErrno(err)
		}
		e := n.fs.truncate(fd, n.path(), int64(sz))
		_ = syscall.Close(fd) // read-only: nothing to lose
		if e != 0 {
			return e
		}
		in.Valid &^= fuse.FATTR_SIZE
	}
	if e := n.LoopbackNode.Setattr(ctx, nil, in, out); e != 0 {
		return e
	}
	n.fs.fixSize(n.path(), &out.Attr)
	return 0
}

// fixSize reports a file's logical size (with its unsynced changes) in a.
func (f *FS) fixSize(path string, a *fuse.Attr) {
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.pending[keyOf(&st)]; p != nil {
		a.Size = uint64(p.size)
		a.Blocks = (a.Size + 511) / 512
		a.SetTimes(nil, &p.mtime, nil)
	}
}

// truncate records a truncate of the file open as fd.
func (f *FS) truncate(fd int, path string, size int64) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := f.check(); e != 0 {
		return e
	}
	p, e := f.get(keyOf(&st), fd, path, true)
	if e != 0 {
		return e
	}
	p.truncate(size)
	return 0
}

// ErrNoFUSE is returned by Available when FUSE cannot be mounted here.
var ErrNoFUSE = errors.New("FUSE is not available")

// Available reports why a lazy file system cannot be mounted here (nil: it
// can): /dev/fuse must exist and the process must be root (mount(2)) or have
// fusermount3.
func Available() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("%w: %w", ErrNoFUSE, err)
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			return fmt.Errorf("%w: not root and no fusermount3", ErrNoFUSE)
		}
	}
	return nil
}
