// Package sandbox defines how a job's code is run in isolation: the Runtime
// interface every sandbox implementation satisfies, the resource limits, and the
// in-sandbox Python runner together with the host side of its frame protocol.
//
// # Runner protocol
//
// The runner (runner.py, embedded in this package) connects to a Unix socket the
// host listens on and speaks length-prefixed JSON frames (package proxy):
//
//	runner → host  hello {version}            once, when ready for work
//	host → runner  exec  {job, code, servers, timeout_ms, output_cap}
//	runner → host  out   {stream, data}       stdout/stderr chunks, any number
//	runner → host  call  {id, method, params} a proxy call (tool, docs, memory)
//	host → runner  reply {id, result | error}
//	runner → host  done  {status, exit_code, error}
//
// The user's code runs in the runner's process with file descriptors 1 and 2
// redirected to pipes the runner reads, so whatever the code writes there arrives as
// out frames and can never be taken for a protocol frame. Every frame the host
// reads is validated; a runner that breaks the protocol ends its job with an error.
//
// A runner whose hello says call_channel gets, with a fresh Python job's exec
// frame (call_channel: true), one end of a socket pair (SCM_RIGHTS): the job's
// process sends its call frames there and reads their replies, past the
// supervisor. Only the job's calls are taken on it; the host closes it when
// the job ends (callchan.go).
package sandbox
