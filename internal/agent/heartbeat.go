package agent

import (
	"context"
	"encoding/json"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/task"
)

func (a *Agent) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	for {
		a.sendHeartbeat(ctx)
		a.maybeRenew(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) sendHeartbeat(ctx context.Context) {
	facts, _ := json.Marshal(a.facts())
	hb := apiv1.Heartbeat{AgentVersion: a.version, Runtime: a.runtime.Name(), LabHost: a.cfg.LabHost, RunningTasks: int(a.running.Load()),
		TaskTypes: []string{string(task.TypeVMProvision), string(task.TypeVMRelease), string(task.TypeTopologyDiscover), string(task.TypePrereqCheck),
			string(task.TypeStorageTransit), string(task.TypeWipeVerify), string(task.TypeSlotValidate),
			string(task.TypeImageStage)}, Facts: facts,
		FirmwareProfile: a.firmwareEvidence(), Prerequisites: a.prereqSummary()}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, data, err := a.do(hctx, "POST", "/api/v1/agent/heartbeat", hb)
	if err != nil {
		a.log.Debug("heartbeat not delivered", "err", err)
		return
	}
	if resp.StatusCode >= 300 {
		a.log.Warn("heartbeat refused", "err", apiError(resp, data))
	}
}
