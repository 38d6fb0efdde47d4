// Package e2e holds end-to-end tests: broker, worker and front-end as separate
// components joined over TCP NATS, real Podman sandboxes, and MCP clients.
package e2e
