package mcp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/policy"
)

// toolArgs are the arguments of any tool that the approval policy looks
// at; the tool's own handler still validates them.
type toolArgs struct {
	SandboxID      string   `json:"sandbox_id"`
	Profile        string   `json:"profile"`
	Command        string   `json:"command"`
	Argv           []string `json:"argv"`
	MemoryMB       int64    `json:"memory_mb"`
	CPUs           float64  `json:"cpus"`
	Pids           int64    `json:"pids"`
	TimeoutSeconds float64  `json:"timeout_seconds"`
	Network        string   `json:"network"`
	Allow          []string `json:"allow"`
	Language       string   `json:"language"`
}

// approvalMiddleware holds tool calls for approval (Config.Approvals):
// any call of a tool a rule names, run_command's argv, create_sandbox's
// limits and network. A refused call is a tool error saying why, so the
// model can adapt; it never reaches the tool.
func (s *Service) approvalMiddleware(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, r sdk.Request) (sdk.Result, error) {
		req, ok := r.(*sdk.CallToolRequest)
		if method != "tools/call" || !ok || req.Params == nil {
			return next(ctx, method, r)
		}
		var in toolArgs
		if len(req.Params.Arguments) > 0 {
			if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
				return toolError(userErr("bad arguments for %s: %v", req.Params.Name, err), ""), nil
			}
		}
		base := approval.Action{Via: "mcp", Owner: callerOf(req).Owner, Sandbox: in.SandboxID}
		if base.Sandbox == "" && req.Params.Name != "create_sandbox" && req.Params.Name != "list_sandboxes" {
			base.Sandbox = s.defaultSandbox(req.Session)
		}
		actions := []approval.Action{base}
		actions[0].Kind, actions[0].Tool = approval.KindTool, req.Params.Name
		switch req.Params.Name {
		case "run_command":
			a := base
			a.Kind, a.Argv = approval.KindExec, in.Argv
			if in.Command != "" {
				a.Argv = []string{"/bin/sh", "-c", in.Command}
			}
			actions = append(actions, a)
		case "run_code":
			a := base
			a.Kind, a.Language = approval.KindCode, in.Language
			actions = append(actions, a)
		case "create_sandbox":
			a := base
			a.Kind, a.Sandbox = approval.KindCreate, ""
			a.Limits = &approval.Limits{MemoryBytes: in.MemoryMB << 20, CPUs: in.CPUs, Pids: in.Pids, TimeoutSeconds: in.TimeoutSeconds}
			if pre, err := policy.Preset(policy.Profile(cmp.Or(in.Profile, s.cfg.Profile))); err == nil {
				// The profile's limits count where the call gives none.
				a.Limits.MemoryBytes = cmp.Or(a.Limits.MemoryBytes, s.cfg.Limits.MemoryBytes, pre.Limits.MemoryBytes)
				a.Limits.CPUs = cmp.Or(a.Limits.CPUs, s.cfg.Limits.CPUs, pre.Limits.CPUs)
				a.Limits.Pids = cmp.Or(a.Limits.Pids, s.cfg.Limits.Pids, pre.Limits.Pids)
				a.Limits.DiskBytes = cmp.Or(s.cfg.Limits.DiskBytes, pre.Limits.DiskBytes)
			}
			actions = append(actions, a)
			if in.Network != string(policy.NetNone) && s.cfg.Network.Mode != policy.NetNone {
				to := s.cfg.Network
				if len(in.Allow) > 0 {
					to.Allow = in.Allow
				}
				n := base
				n.Kind, n.Sandbox, n.From, n.To = approval.KindNetwork, "", &policy.Network{Mode: policy.NetNone}, &to
				actions = append(actions, n)
			}
		}
		for _, a := range actions {
			if err := s.cfg.Approvals.Check(ctx, a, elicitor(req.Session)); err != nil {
				return toolError(err, ""), nil
			}
		}
		return next(ctx, method, r)
	}
}

// checkRead holds a read_file of size bytes for approval.
func (s *Service) checkRead(ctx context.Context, req *sdk.CallToolRequest, sandboxID, path string, size int64) error {
	if s.cfg.Approvals == nil {
		return nil
	}
	return s.cfg.Approvals.Check(ctx, approval.Action{Kind: approval.KindReadFile, Via: "mcp", Owner: callerOf(req).Owner,
		Sandbox: sandboxID, Path: path, Size: size}, elicitor(req.Session))
}

// elicitor asks the client's human through MCP elicitation, if the client
// declared it can; nil otherwise (the approval then waits at
// /v1/approvals).
func elicitor(ss *sdk.ServerSession) approval.Elicitor {
	if ss == nil {
		return nil
	}
	ip := ss.InitializeParams()
	if ip == nil || ip.Capabilities == nil || ip.Capabilities.Elicitation == nil {
		return nil
	}
	return func(ctx context.Context, msg string) (bool, string, error) {
		res, err := ss.Elicit(ctx, &sdk.ElicitParams{Message: msg, RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"reason": map[string]any{"type": "string", "description": "Why (optional; recorded in the audit log)"},
			},
		}})
		if err != nil {
			return false, "", fmt.Errorf("elicitation/create: %w", err)
		}
		why, _ := res.Content["reason"].(string)
		switch res.Action {
		case "accept":
			return true, why, nil
		case "decline", "cancel":
			if why == "" {
				why = "the user chose " + res.Action
			}
			return false, why, nil
		}
		return false, "", errors.New("elicitation: unknown action " + res.Action)
	}
}

// openWorld is the openWorldHint of the tools that run code: true when the
// sandboxes the tools make may reach the network (create_sandbox can only
// narrow the server's policy), so clients gating open-world tools gate
// them.
func (s *Service) openWorld() bool { return s.cfg.Network.Mode != policy.NetNone }

// defaultSandbox is the ID of a session's default sandbox, "" if it has
// none yet.
func (s *Service) defaultSandbox(ss *sdk.ServerSession) string {
	s.mu.Lock()
	se := s.sessions[ss]
	s.mu.Unlock()
	if se == nil {
		return ""
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	return se.defaultID
}
