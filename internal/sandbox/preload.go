package sandbox

import (
	"fmt"
	"strings"
)

// DefaultPreload is what a container's zygote imports before its first job
// unless the worker is told otherwise (--preload): the data stack of the
// default image, so that a job importing pandas or pyplot pays nothing. An
// image without them (the slim one) skips them.
var DefaultPreload = []string{"numpy", "pandas", "matplotlib.pyplot"}

// maxPreload bounds the --preload list (it becomes one argument of the runner).
const maxPreload = 32

// CheckPreload checks a preload list: dotted Python module names, at most 32.
func CheckPreload(mods []string) error {
	if len(mods) > maxPreload {
		return fmt.Errorf("preload: %d modules, at most %d", len(mods), maxPreload)
	}
	for _, m := range mods {
		if !moduleName(m) {
			return fmt.Errorf("preload: %q is not a module name (want dotted Python identifiers, e.g. matplotlib.pyplot)", m)
		}
	}
	return nil
}

// ParsePreload parses a --preload value: module names separated by commas;
// "none" or "" preloads nothing.
func ParsePreload(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return nil, nil
	}
	var mods []string
	for _, m := range strings.Split(s, ",") {
		if m = strings.TrimSpace(m); m != "" {
			mods = append(mods, m)
		}
	}
	return mods, CheckPreload(mods)
}

func moduleName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" {
			return false
		}
		for i, r := range part {
			letter := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
			if !letter && (i == 0 || r < '0' || r > '9') {
				return false
			}
		}
	}
	return true
}
