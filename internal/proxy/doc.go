// Package proxy carries calls between a sandbox and its host: the length-prefixed
// JSON frame codec spoken by the in-sandbox runner, and (later) the MCP client pool
// and the NATS responder that answer the sandbox's tool calls.
package proxy
