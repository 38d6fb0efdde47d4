// Package proxy carries calls between a sandbox and its host: the length-prefixed
// JSON frame codec spoken by the in-sandbox runner, and the NATS request/reply
// (Call, Responder) that takes a sandbox's calls from its worker to a front-end:
// any front-end answers memory and docs calls (subject ProxyAny), and those
// that proxy a server answer its tool calls (ProxyServer), each checking the
// job's capability and record. The MCP client pool answering them is package
// mcpclients; the handler that answers them is package proxyresp.
package proxy
