package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// A synchronous run_python (or run_javascript) of a 2026-07-28 client that
// declared elicitation asks about its job's parked calls the way that
// revision asks anything of a client: by multi round-trip requests (MRTR).
// Servers may not send requests of their own there, so the call does not
// wait for the job alone: when one of its calls is parked for approval, the
// call returns an input_required result whose inputRequests hold one form
// elicitation per parked call (keyed by approval id) and whose requestState
// names the job. The client asks its user and calls again with the same
// params, inputResponses and the state; the answers decide the calls (the
// first answer wins, wherever it comes from), and the retry waits for the
// same job, asking again if another call parks. Any front-end answers the
// retry: the job and its approvals are in the shared state.
//
// The state is not a credential: it names a job of the caller's namespace,
// which the retry reads with the caller's own namespace (another's job is
// "not found", as for tasks), and the approvals already asked, so that one
// the user dismissed is not asked again in this call. It is bounded and
// checked like any other input.

// mrtrStatePrefix marks a requestState this server issued (and its version).
const mrtrStatePrefix = "mcpexec-run.1."

// Bounds of a requestState.
const (
	maxMRTRState = 8 << 10
	maxMRTRAsked = 64
)

// mrtrState is what a requestState carries.
type mrtrState struct {
	Job   string   `json:"job"`
	Asked []string `json:"asked,omitempty"`
}

func (s mrtrState) encode() string {
	data, _ := json.Marshal(s) // strings always encode
	return mrtrStatePrefix + base64.RawURLEncoding.EncodeToString(data)
}

func decodeMRTRState(raw string) (mrtrState, error) {
	var s mrtrState
	bad := errors.New("requestState is not one this server issued for a run: call the tool again without it to start a new job")
	if len(raw) > maxMRTRState || !strings.HasPrefix(raw, mrtrStatePrefix) {
		return s, bad
	}
	data, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(raw, mrtrStatePrefix))
	if err != nil || json.Unmarshal(data, &s) != nil || !jobs.ValidUserID(s.Job) || len(s.Asked) > maxMRTRAsked || slices.ContainsFunc(s.Asked, func(id string) bool { return !jobs.ValidID(id) }) {
		return s, bad
	}
	return s, nil
}

// asksByMRTR reports whether a call is one to run by multi round-trip
// requests: a 2026-07-28 request that declared elicitation.
func (h *handler) asksByMRTR(ctx context.Context) bool {
	info := server.RequestProtocolInfoFromContext(ctx)
	return info != nil && info.Modern && info.ClientCapabilities != nil && info.ClientCapabilities.Elicitation != nil
}

// runByMRTR submits job and waits for it, or for one of its calls to park.
func (h *handler) runByMRTR(ctx context.Context, req mcp.CallToolRequest, job *jobs.Job, log *slog.Logger) *mcp.CallToolResult {
	if _, err := h.r.Submit(ctx, job); err != nil {
		var inv *jobs.InvalidError
		if errors.As(err, &inv) {
			log.Info(req.Params.Name+" refused", "err", err)
			return mcp.NewToolResultError(err.Error())
		}
		log.Warn(req.Params.Name+" failed", "err", err)
		return mcp.NewToolResultError(fmt.Sprintf("the job could not be run: %v", err))
	}
	return h.awaitOrAsk(ctx, req, job.Namespace, mrtrState{Job: job.ID}, log)
}

// resumeByMRTR is a retry of an input_required run: it passes on the
// answers, then waits for the job again.
func (h *handler) resumeByMRTR(ctx context.Context, req mcp.CallToolRequest) *mcp.CallToolResult {
	if !h.asksByMRTR(ctx) {
		return mcp.NewToolResultError("inputResponses and requestState answer an input_required result, which this server gives only to 2026-07-28 requests that declare elicitation: call the tool again without them")
	}
	st, err := decodeMRTRState(req.Params.RequestState)
	if err != nil {
		return mcp.NewToolResultError(err.Error())
	}
	ns := h.namespace(ctx)
	log := h.logger(ctx, ns, st.Job)
	rec, err := h.r.Get(ctx, ns, st.Job)
	if err != nil {
		if errs.KindOf(err) == errs.NotFound {
			return mcp.NewToolResultError(fmt.Sprintf("job %s of requestState is not found: call the tool again without it to start a new job", st.Job))
		}
		return mcp.NewToolResultError(fmt.Sprintf("look up job %s: %v", st.Job, err))
	}
	if !rec.Status.Terminal() && len(req.Params.InputResponses) > 0 {
		h.passAnswers(ctx, ns, st, req.Params.InputResponses, log)
	}
	return h.awaitOrAsk(ctx, req, ns, st, log)
}

// passAnswers decides the calls the client answered. Keys that name no call
// this request asked about are ignored, as are answers that decide nothing
// (cancelled): those calls wait for another answer.
func (h *handler) passAnswers(ctx context.Context, ns string, st mrtrState, answers mcp.InputResponses, log *slog.Logger) {
	for key := range answers {
		if !slices.Contains(st.Asked, key) {
			continue
		}
		el := server.ElicitationResponse(answers, key)
		if el == nil {
			log.Info("an input response that is not an elicitation result: ignored", "approval", errs.Clip(key, 64))
			continue
		}
		decision, reason, ok := approvalAnswer(string(el.Action), el.Content)
		if !ok {
			continue
		}
		if _, err := h.r.DecideApproval(context.WithoutCancel(ctx), ns, key, decision, ElicitedBy, reason); err != nil &&
			errs.KindOf(err) != errs.Conflict && errs.KindOf(err) != errs.NotFound {
			log.Warn("pass on the client's answer to a parked call", "approval", key, "err", err)
		}
	}
}

// mrtrLinger is how long a call that saw one of its job's calls park waits
// for more before asking: calls parked together are asked in one round (a
// client allows ten rounds per request).
const mrtrLinger = 150 * time.Millisecond

// awaitOrAsk waits for the job st names to end, and returns its result; or,
// when one of its calls waits for approval and was not asked about in this
// request before, returns input_required asking about every such call.
// When the caller goes away, the job is cancelled, as a synchronous run's.
func (h *handler) awaitOrAsk(ctx context.Context, req mcp.CallToolRequest, ns string, st mrtrState, log *slog.Logger) *mcp.CallToolResult {
	if progress := progressSender(ctx, req, h.opts.MaxProgress); progress != nil {
		if stop, err := h.r.WatchOutput(ns, st.Job, progress.output); err == nil {
			defer stop()
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, below
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type outcome struct {
		rec *jobs.Record
		err error
	}
	done := make(chan outcome, 1)
	wg.Go(func() {
		rec, err := h.r.Wait(wctx, ns, st.Job)
		done <- outcome{rec, err}
	})
	parked := make(chan struct{}, 1)
	defer followParked(wctx, h.r, ns, st.Job, func(jobs.Approval) {
		select {
		case parked <- struct{}{}:
		default:
		}
	})()
	for {
		select {
		case o := <-done:
			if o.err != nil {
				if ctx.Err() != nil {
					h.cancelGone(ctx, ns, st.Job, log)
				}
				return mcp.NewToolResultError(fmt.Sprintf("the job could not be run: %v", o.err))
			}
			log.Info(req.Params.Name+" finished", "status", o.rec.Status)
			out := resultOf(o.rec, h.opts.OutputMode)
			h.attachFiles(ctx, ns, o.rec, out)
			return out
		case <-ctx.Done():
			h.cancelGone(ctx, ns, st.Job, log)
			return mcp.NewToolResultError("the caller went away")
		case <-parked:
		}
		if res := h.ask(wctx, ns, st); res != nil {
			log.Info(req.Params.Name+" asks the client about parked calls", "calls", len(res.InputRequests))
			return res
		}
	}
}

// ask returns the input_required result asking about the job's calls that
// wait for approval and were not asked about before, or nil when there are
// none.
func (h *handler) ask(ctx context.Context, ns string, st mrtrState) *mcp.CallToolResult {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(mrtrLinger):
	}
	list, err := h.r.Approvals(ctx, ns)
	if err != nil {
		return nil
	}
	b := server.NewInputRequestBuilder("")
	fresh := 0
	for _, ap := range list {
		if ap.JobID != st.Job || slices.Contains(st.Asked, ap.ID) || len(st.Asked) >= maxMRTRAsked {
			continue
		}
		msg, schema := approvalQuestion(ap)
		b.Elicit(ap.ID, mcp.ElicitationParams{Mode: mcp.ElicitationModeForm, Message: msg, RequestedSchema: schema})
		st.Asked = append(st.Asked, ap.ID)
		fresh++
	}
	if fresh == 0 {
		return nil
	}
	return b.RequestState(st.encode()).ToolResult()
}

// cancelGone cancels the job of a caller that went away.
func (h *handler) cancelGone(ctx context.Context, ns, id string, log *slog.Logger) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.r.Cancel(cctx, ns, id, "the caller went away"); err != nil && errs.KindOf(err) != errs.Conflict {
		log.Warn("cancel job", "err", err)
	}
}
