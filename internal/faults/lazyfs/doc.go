// Package lazyfs is a power-loss harness for tests: a FUSE file system that
// passes through to a backing directory but keeps what was written to each
// file since that file's last fsync in memory, as the page cache of an OS
// does, and drops it when the test cuts the power (the model of Jepsen's
// LazyFS).
//
// What is modelled:
//
//   - Data: a write (and a truncate) reaches the backing directory only when
//     the file is fsynced (fsync or fdatasync, through any of its handles).
//     Until then reads see it, and Cut loses it. Nothing else flushes: no
//     background writeback, so a cut loses every unsynced byte (the worst
//     case of a real kernel, which may also have written some of it back).
//   - Metadata: creating, renaming, linking and removing files and
//     directories pass through at once, as if the directory were synced
//     (so a file created and never fsynced survives a cut, empty). LazyFS
//     does the same; a journaling file system mostly does too.
//   - Kill: Freeze stops every operation with EIO but keeps what is unsynced,
//     as the OS keeps a killed process's writes; Thaw lets a new process read
//     them. That is `kill -9`: what the process had not handed to the OS is
//     lost, what it had is not.
//
// The backing directory itself is not fsynced: it is the "disk" of the model,
// and only the harness decides what a power cut loses. Files that are
// memory-mapped (bbolt's) must not live on a mount served by the same process:
// a page fault on them can deadlock with the Go garbage collector.
package lazyfs
