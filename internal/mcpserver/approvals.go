package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// approvalSweep is how often a synchronous call also lists its namespace's
// parked calls, besides following them as they are parked: the follow
// starts as the job does, and a call parked before its watch was in place
// is found by a list (one at once, then one per sweep).
const approvalSweep = 5 * time.Second

// ElicitedBy is who an approval answered by elicitation was decided by.
const ElicitedBy = "the MCP client that made the call (elicitation)"

// askClient asks the calling MCP client, by elicitation, about each call of
// job that waits for approval while the job runs, when the client declared
// elicitation (2025-11-25 sessions; 2026-07-28 forbids server-initiated
// requests). Accepting with approve true approves the call; accepting with
// false, or declining, denies it; cancelling leaves it for another answer
// (the jobs API, the console). The first answer wins, wherever it comes
// from. stop ends the asking and waits for what it started.
func (h *handler) askClient(ctx context.Context, ns, job string, log *slog.Logger) (stop func()) {
	if !clientElicits(ctx) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex // guards asked
	asked := map[string]bool{}
	stopFollow := followParked(ctx, h.r, ns, job, func(ap jobs.Approval) {
		mu.Lock()
		defer mu.Unlock()
		if asked[ap.ID] || ctx.Err() != nil {
			return
		}
		asked[ap.ID] = true
		wg.Go(func() { h.elicit(ctx, ns, ap, log) })
	})
	return func() {
		cancel()
		stopFollow() // no more asking once it returns
		wg.Wait()
	}
}

// followParked calls fn with each call of job that waits for approval:
// those parked from now on, as namespace ns's watch tells, and those its
// listings find (one at once, for a call parked before the watch was in
// place, then one every approvalSweep, should the watch break). fn may be
// called for the same call more than once, and from two goroutines. stop
// ends the following and waits for it.
func followParked(ctx context.Context, svc jobs.Service, ns, job string, fn func(jobs.Approval)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		// Ends with ctx (or a broken watch: the sweep below goes on).
		_ = svc.FollowApprovals(ctx, ns, func(ev jobs.ApprovalEvent) error {
			if ev.Kind == jobs.ApprovalAsked && ev.JobID == job {
				fn(ev.Approval)
			}
			return nil
		})
	})
	wg.Go(func() {
		t := time.NewTicker(approvalSweep)
		defer t.Stop()
		for {
			if list, err := svc.Approvals(ctx, ns); err == nil { // else the next sweep may do better
				for _, ap := range list {
					if ap.JobID == job {
						fn(ap)
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// elicit asks the client about one parked call and passes on its answer.
func (h *handler) elicit(ctx context.Context, ns string, ap jobs.Approval, log *slog.Logger) {
	msg, schema := approvalQuestion(ap)
	req := mcp.ElicitationRequest{Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)}, Params: mcp.ElicitationParams{
		Message: msg, RequestedSchema: schema,
	}}
	res, err := h.srv.RequestElicitation(ctx, req)
	if err != nil {
		log.Debug("could not ask the client about a parked call", "approval", ap.ID, "err", err)
		return
	}
	decision, reason, ok := approvalAnswer(string(res.Action), res.Content)
	if !ok {
		return // dismissed: another answer may come
	}
	if _, err := h.r.DecideApproval(context.WithoutCancel(ctx), ns, ap.ID, decision, ElicitedBy, reason); err != nil && errs.KindOf(err) != errs.Conflict {
		log.Warn("pass on the client's answer to a parked call", "approval", ap.ID, "err", err)
	}
}

// approvalQuestion is the form elicitation that asks a person about a
// parked call: its message, and a schema of approve (boolean) and reason.
// Both elicitation/create (2025-11-25) and a task's inputRequests (the tasks
// extension) ask with it.
func approvalQuestion(ap jobs.Approval) (string, map[string]any) {
	args := string(ap.Arguments)
	if ap.ArgumentsTruncated {
		args += fmt.Sprintf(" … (%d bytes in all)", ap.ArgumentsBytes)
	}
	return fmt.Sprintf("The code of job %s wants to call %s/%s with %s (tool rule %q). Allow this one call?", ap.JobID, ap.Server, ap.Tool, args, ap.Rule),
		map[string]any{
			"type": "object",
			"properties": map[string]any{
				"approve": map[string]any{"type": "boolean", "title": "Allow " + ap.Server + "/" + ap.Tool, "description": "true allows this one call; false denies it"},
				"reason":  map[string]any{"type": "string", "title": "Reason", "maxLength": 1000},
			},
			"required": []string{"approve"},
		}
}

// approvalAnswer turns an elicitation's answer (action and content) into a
// decision: accepted with approve true approves the call; accepted with
// false, or declined, denies it; cancelled (or an action it does not know)
// decides nothing (ok false), leaving the call to another answer.
func approvalAnswer(action string, content any) (decision, reason string, ok bool) {
	switch mcp.ElicitationResponseAction(action) {
	case mcp.ElicitationResponseActionAccept:
		var c struct {
			Approve bool   `json:"approve"`
			Reason  string `json:"reason"`
		}
		if b, err := json.Marshal(content); err == nil && json.Unmarshal(b, &c) == nil {
			reason = c.Reason
			if c.Approve {
				return "approve", errs.Clip(reason, 1000), true
			}
		}
		return "deny", errs.Clip(reason, 1000), true
	case mcp.ElicitationResponseActionDecline:
		return "deny", "declined by the MCP client", true
	}
	return "", "", false
}

// clientElicits reports whether the calling session declared elicitation.
func clientElicits(ctx context.Context) bool {
	s, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo)
	return ok && s.GetClientCapabilities().Elicitation != nil
}
