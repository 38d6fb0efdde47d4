// Package submit is what `frontend submit` does (its flags are cmd/frontend's): it pushes a JSONL file of jobs
// through a front-end's HTTP jobs API, shows progress on the terminal, waits for
// every job, and writes the final records as JSONL.
package submit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
)

// Config is what `frontend submit` was asked to do.
type Config struct {
	URL         string        // front-end base URL
	Token       string        // bearer token
	In          string        // JSONL file of jobs; "-" is stdin
	Out         string        // JSONL file of records; "-" is stdout
	Batch       int           // jobs per POST
	Concurrency int           // jobs waited for at once
	Wait        time.Duration // long-poll timeout of one wait request
	Progress    time.Duration // how often progress is printed; 0 never
}

// Validate says what is wrong with c.
func (c *Config) Validate() error {
	if c.In == "" {
		return cli.Usagef("submit needs a JSONL file of jobs (or - for stdin)")
	}
	if c.Batch < 1 || c.Batch > jobsapi.MaxBatch {
		return cli.Usagef("--batch must be 1..%d, got %d", jobsapi.MaxBatch, c.Batch)
	}
	if c.Concurrency < 1 {
		return cli.Usagef("--concurrency must be at least 1, got %d", c.Concurrency)
	}
	return nil
}

// Run reads c.In, submits its jobs, writes their final records to c.Out,
// and reports an error when any did not succeed.
func (c *Config) Run(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	if err := c.Validate(); err != nil {
		return err
	}
	in := stdin
	if c.In != "-" {
		f, err := os.Open(c.In)
		if err != nil {
			return cli.Usagef("open jobs file: %v", err)
		}
		defer func() { _ = f.Close() }() // read only: closing cannot lose data
		in = f
	}
	out := stdout
	if c.Out != "-" {
		f, ferr := os.Create(c.Out)
		if ferr != nil {
			return fmt.Errorf("create results file: %w (check the directory exists and is writable)", ferr)
		}
		defer func() {
			if cerr := f.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("write results file: %w", cerr)
			}
		}()
		out = f
	}
	reqs, err := ReadJobs(in)
	if err != nil {
		return cli.Usagef("%v", err)
	}
	sum, err := c.Submit(ctx, reqs, out, stderr)
	if err != nil {
		return err
	}
	if sum.Failed > 0 {
		return fmt.Errorf("%d of %d jobs did not succeed (see their records in the output)", sum.Failed, sum.Total)
	}
	return nil
}

// ReadJobs reads one job object per line, skipping blank lines; every line gets
// an id (generated when absent) so the run can be resumed by submitting the same
// file again.
func ReadJobs(r io.Reader) ([]jobsapi.JobRequest, error) {
	var out []jobsapi.JobRequest
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var j jobsapi.JobRequest
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil {
			return nil, fmt.Errorf("jobs file line %d: %w (want a JSON object with code, and optionally id, servers, timeout, max_attempts, labels, session, pool, after, after_any, memory_mb, cpus, language, files)", line, err)
		}
		if j.ID == "" {
			j.ID = jobs.NewID()
		}
		out = append(out, j)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read jobs file: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("the jobs file has no jobs")
	}
	return out, nil
}

// parentsFirst orders reqs so that every job comes after the parents it
// names in the file (batches are submitted in order, and a parent must be
// known when its child is submitted).
func parentsFirst(reqs []jobsapi.JobRequest) ([]jobsapi.JobRequest, error) {
	js := make([]*jobs.Job, len(reqs))
	for i, q := range reqs {
		js[i] = &jobs.Job{ID: q.ID, After: q.After, AfterAny: q.AfterAny}
	}
	order, err := jobs.Order(js)
	if err != nil {
		return reqs, fmt.Errorf("jobs file: %w", err)
	}
	out := make([]jobsapi.JobRequest, len(reqs))
	for k, i := range order {
		out[k] = reqs[i]
	}
	return out, nil
}

// Summary counts the outcomes of a run.
type Summary struct {
	Total, Submitted, Done, Succeeded, Failed int
}

// Submit submits reqs in batches, waits for each job, and writes each final
// record to out as one JSON line, in completion order. Progress goes to status.
func (c *Config) Submit(ctx context.Context, reqs []jobsapi.JobRequest, out, status io.Writer) (Summary, error) {
	reqs, err := parentsFirst(reqs)
	if err != nil {
		return Summary{Total: len(reqs)}, err
	}
	var submitted, done, failed atomic.Int64
	st := &statusLine{w: status}
	stopProgress := c.progress(len(reqs), &submitted, &done, &failed, st)
	defer stopProgress()
	// Approvals asked for this run's jobs are printed as they come.
	watch := c.newApprovalWatch(st)
	for _, q := range reqs {
		if q.ID != "" {
			watch.add(q.ID)
		}
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { watch.run(watchCtx) })
	defer func() { stopWatch(); watching.Wait() }()

	ids := make(chan string, len(reqs))
	var outMu sync.Mutex // guards out
	enc := json.NewEncoder(out)
	write := func(v any) error {
		outMu.Lock()
		defer outMu.Unlock()
		return enc.Encode(v)
	}
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	fail := func(err error) { errOnce.Do(func() { firstErr = err }) }
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range c.Concurrency {
		wg.Go(func() {
			for id := range ids {
				rec, err := c.waitJob(ctx, id)
				if err != nil {
					fail(err)
					cancel()
					return
				}
				if rec.Status != jobs.StatusSuccess {
					failed.Add(1)
				}
				done.Add(1)
				if err := write(rec); err != nil {
					fail(fmt.Errorf("write result: %w", err))
					cancel()
					return
				}
			}
		})
	}
	for lo := 0; lo < len(reqs) && ctx.Err() == nil; lo += c.Batch {
		batch := reqs[lo:min(lo+c.Batch, len(reqs))]
		var items []jobsapi.Item
		if err := c.do(ctx, http.MethodPost, "/api/jobs", batch, &items); err != nil {
			fail(err)
			break
		}
		for i, it := range items {
			submitted.Add(1)
			if it.Record != nil {
				watch.add(it.Job.ID)
			}
			if it.Error != nil && (it.Record == nil || !it.Status.Terminal()) {
				// Not accepted (conflict without a record, broker trouble): report it.
				failed.Add(1)
				done.Add(1)
				_ = write(map[string]any{"job": map[string]string{"id": batch[i].ID}, "error": it.Error}) // a failing output is reported by the next write
				continue
			}
			ids <- batch[i].ID
		}
	}
	close(ids)
	wg.Wait()
	stopProgress()
	s := Summary{Total: len(reqs), Submitted: int(submitted.Load()), Done: int(done.Load()), Failed: int(failed.Load())}
	s.Succeeded = s.Done - s.Failed
	return s, firstErr
}

func (c *Config) waitJob(ctx context.Context, id string) (*jobs.Record, error) {
	for {
		var rec jobs.Record
		if err := c.do(ctx, http.MethodGet, "/api/jobs/"+id+"/wait?timeout="+c.Wait.String(), nil, &rec); err != nil {
			return nil, err
		}
		if rec.Status.Terminal() {
			return &rec, nil
		}
	}
}

func (c *Config) progress(total int, submitted, done, failed *atomic.Int64, w *statusLine) (stop func()) {
	if c.Progress <= 0 {
		return func() {}
	}
	start := time.Now()
	print := func(end bool) {
		el := time.Since(start).Seconds()
		w.progress(fmt.Sprintf("submitted %d/%d  done %d  failed %d  %.0f jobs/s", submitted.Load(), total, done.Load(), failed.Load(), float64(done.Load())/max(el, 0.001)), end)
	}
	t := time.NewTicker(c.Progress)
	quit := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-t.C:
				print(false)
			case <-quit:
				return
			}
		}
	})
	return func() {
		once.Do(func() {
			t.Stop()
			close(quit)
			wg.Wait()
			print(true)
		})
	}
}

// do sends one API request and decodes the answer; an API error becomes an error
// with its code and message.
func (c *Config) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.URL, "/")+path, rd)
	if err != nil {
		return fmt.Errorf("bad --url %q: %w", c.URL, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w (is the front-end running with --http at %s?)", method, path, err, c.URL)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end or abandoned: nothing to report
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var e jobsapi.ErrorResponse
		if json.Unmarshal(data, &e) == nil && e.Error.Code != "" {
			return fmt.Errorf("%s %s: %s (%s): %s", method, path, resp.Status, e.Error.Code, e.Error.Message)
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}
