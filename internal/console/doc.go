// Package console is the front-end's web console at /ui/: static pages
// embedded in the binary (plain ES modules, no build step) and the JSON
// endpoints under /api/console/ they read besides the jobs API (a job's
// timeline from its record and the recorded spans, the fleet, the
// namespace's memory, metric history). The endpoints sit behind the same
// token guard as /api/jobs: a token sees its namespace, an admin token the
// namespace it names.
package console
