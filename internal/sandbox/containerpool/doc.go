// Package containerpool is what the container runtimes (internal/sandbox/podman
// and internal/sandbox/docker) share beyond the runner: a container's start
// (its runner directory, socket, secret and handshake) and removal in the
// background, the warm pool and its filler, the containers kept idle for
// their namespace's next job, sessions, the run path of a job, and the
// removal of containers a worker left behind.
//
// A runtime supplies only its engine calls, as an Engine: create and start a
// container, remove one, list the managed ones, and explain one that stopped.
// The package imports neither the Podman bindings nor the Docker client.
package containerpool
