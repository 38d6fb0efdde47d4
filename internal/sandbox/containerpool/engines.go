package containerpool

// Engine names (Info.Engine): the container runtimes' values of --runtime.
const (
	Podman = "podman"
	Docker = "docker"
)
