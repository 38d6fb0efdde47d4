// Package proxy carries calls between a sandbox and its host: the length-prefixed
// JSON frame codec spoken by the in-sandbox runner, and the NATS request/reply
// (Call, Responder) that takes a sandbox's calls from its worker to the front-end
// that submitted the job. The MCP client pool answering them is package
// mcpclients; the front-end's handler is in package frontend.
package proxy
