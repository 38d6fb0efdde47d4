package sandbox

import (
	"errors"
	"slices"
	"strings"
)

// ErrNoImage is what a container runtime's New returns (wrapped, with how
// to build it) when the sandbox image does not exist.
var ErrNoImage = errors.New("not found")

// LanguagesLabel is the image label that lists the languages its sandboxes
// run (comma-separated); deploy/sandbox/build.sh sets it. An image without it
// runs Python only.
const LanguagesLabel = "io.mcpexec.languages"

// AddLabelledLanguages adds to langs the languages beyond Python that an
// image's LanguagesLabel value lists and langs lacks.
func AddLabelledLanguages(langs []string, label string) []string {
	for _, l := range strings.Split(label, ",") {
		if l = strings.TrimSpace(l); l == JavaScript && !slices.Contains(langs, l) {
			langs = append(langs, l)
		}
	}
	return langs
}
