package sandbox

import (
	"regexp"
	"strings"
	"time"
)

// DataWarmFor is how long after a job that names a preloaded module a
// runtime's new sandboxes start their data zygote before their first job
// (importing the data stack takes about a second of CPU; a worker whose
// jobs never use it never pays for it).
const DataWarmFor = 30 * time.Minute

// DataExpectation is a runtime's memory of its last job that named one of
// the preload modules (the data stack): a sandbox started while it expects
// none starts its data zygote at its first such job instead of before its
// first job (the runner's --preload-lazy). Safe for concurrent use; the
// zero value expects none and sees none.
type DataExpectation struct {
	words *regexp.Regexp // the preload modules' top-level names, as words
	last  lately         // when such a job last came
}

// NewDataExpectation returns the expectation of the preload modules preload
// (CheckPreload's; none: it never expects any).
func NewDataExpectation(preload []string) *DataExpectation {
	e := &DataExpectation{}
	if len(preload) == 0 {
		return e
	}
	names := make([]string, len(preload))
	for i, m := range preload {
		names[i] = regexp.QuoteMeta(strings.SplitN(m, ".", 2)[0])
	}
	// As the supervisor routes a job to the data zygote: a top-level name
	// as a word of the code.
	e.words = regexp.MustCompile(`\b(?:` + strings.Join(names, "|") + `)\b`)
	return e
}

// Saw notes job, so that the sandboxes started next expect more jobs that
// use the data stack when it names one of its modules.
func (e *DataExpectation) Saw(job Job) {
	if e.words != nil && job.Language != JavaScript && e.words.MatchString(job.Code) {
		e.last.saw()
	}
}

// Expected reports whether a sandbox started now should start its data
// zygote before its first job.
func (e *DataExpectation) Expected() bool { return e.last.within(DataWarmFor) }
