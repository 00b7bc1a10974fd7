package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func (a *Agent) do(ctx context.Context, method, path string, body any) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	base, idx := a.srv.current()
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "gpuaas-hostd/"+a.version)
	resp, err := a.hc.Load().Do(req)
	if err != nil {
		// A deadline (a blackholed connection) counts against the server; shutdown does not.
		if !errors.Is(ctx.Err(), context.Canceled) && a.srv.failover(idx) {
			a.log.Warn("controller unreachable; failing over", "server", base, "err", err)
		}
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err == nil && unavailable(resp.StatusCode) && a.srv.failover(idx) {
		// A replica without its database, or a proxy without a backend: another may answer.
		a.log.Warn("controller unavailable; failing over", "server", base, "status", resp.Status)
	}
	return resp, data, err
}

// unavailable is an answer that says "try again, maybe elsewhere": nothing was applied.
func unavailable(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

func apiError(resp *http.Response, data []byte) error {
	var ae apiv1.Error
	if json.Unmarshal(data, &ae) == nil && ae.Code != "" {
		return fmt.Errorf("%s: %s (%s)", resp.Status, ae.Message, ae.Code)
	}
	return fmt.Errorf("%s", resp.Status)
}
