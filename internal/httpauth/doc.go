// Package httpauth is the front-end's HTTP authentication: who a request's
// caller is, from a bearer token (the tokens file's namespace and admin
// tokens, OAuth access tokens of the configured issuers) or, for /metrics,
// from loopback or a metrics token. An Auth is built once where the HTTP
// server is built and guards every route that needs a caller; the handlers
// behind it (MCP, the jobs API, the console) read the caller from the
// request's context (FromContext, Namespace, IsAdmin) and never from a
// header.
package httpauth
