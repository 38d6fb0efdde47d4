package mcpserver

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
)

// Client capabilities a tool needs (SEP-2575). From protocol version
// 2026-07-28 a request declares the client's capabilities in its own _meta,
// and a server that needs one the request did not declare must answer
// MissingRequiredClientCapabilityError (-32021; HTTP 400), naming what it
// needs as a ClientCapabilities object. mcp-go turns any error of a tool
// handler into an internal error (-32603), so the check is made here, in
// front of mcp-go, before the tool runs: the task layer claims such a call on
// both transports (see Tasks.claims).

// ClientNeeds maps a tool name to the client capabilities it cannot run
// without, as a ClientCapabilities object: {"sampling": {}}, or
// {"extensions": {"io.modelcontextprotocol/tasks": {}}} for an extension.
type ClientNeeds map[string]map[string]any

// missingCapabilities returns what of the capabilities tool needs the request
// with params does not declare, or nil. Requests of protocol versions before
// 2026-07-28 declared their capabilities once, at initialize; they are not
// checked here.
func (n ClientNeeds) missingCapabilities(tool string, params json.RawMessage) map[string]any {
	need := n[tool]
	if len(need) == 0 {
		return nil
	}
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil {
		return nil // mcp-go reports the malformed request
	}
	var version string
	if json.Unmarshal(p.Meta[mcp.MetaKeyProtocolVersion], &version) != nil || !mcp.IsModernProtocol(version) {
		return nil
	}
	var declared map[string]any
	_ = json.Unmarshal(p.Meta[mcp.MetaKeyClientCapabilities], &declared) // absent or malformed: none declared (mcp-go refuses it anyway)
	return uncovered(declared, need)
}

// uncovered returns the part of need that declared lacks: a capability is
// covered when declared has it, and, where need names sub-capabilities
// (extensions, say), has each of those too.
func uncovered(declared, need map[string]any) map[string]any {
	out := map[string]any{}
	for name, sub := range need {
		have, ok := declared[name]
		if !ok || have == nil {
			out[name] = sub
			continue
		}
		subNeed, _ := sub.(map[string]any)
		if len(subNeed) == 0 {
			continue
		}
		subHave, _ := have.(map[string]any)
		if miss := uncovered(subHave, subNeed); len(miss) > 0 {
			out[name] = miss
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// missingCapabilityError is the -32021 error for a tool call that lacks
// the client capabilities in missing.
func missingCapabilityError(tool string, missing map[string]any) *rpcError {
	names := make([]string, 0, len(missing))
	for name := range missing {
		names = append(names, name)
	}
	slices.Sort(names)
	return &rpcError{
		Code: mcp.MISSING_REQUIRED_CLIENT_CAPABILITY,
		Message: fmt.Sprintf("tool %s needs the client capabilities %s, which the request's _meta %s does not declare: declare them (if the client has them) and retry",
			tool, strings.Join(names, ", "), mcp.MetaKeyClientCapabilities),
		Data: map[string]any{"requiredCapabilities": missing},
	}
}
