// Package sandboximage carries the build recipe of the mcpexec sandbox image, so a
// binary can build the image itself (for example from a `doctor` or `image build`
// command) on a machine with no container registry.
package sandboximage

import _ "embed"

// DefaultImage is the name build.sh gives the image unless told otherwise, and the
// image the Podman runtime uses by default.
const DefaultImage = "localhost/mcpexec-sandbox:latest"

// BuildScript is build.sh: run it with bash as root, with an optional image name
// argument (or MCPEXEC_IMAGE) and --force to rebuild an existing image. It
// debootstraps Debian bookworm with python3 from the host's apt mirror and imports
// the result with `podman import`.
//
//go:embed build.sh
var BuildScript []byte
