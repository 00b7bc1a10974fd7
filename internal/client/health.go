package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// Unauthenticated routes.

// Healthz succeeds when the controller process answers.
func (c *Client) Healthz(ctx context.Context) error {
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/healthz"}, nil)
	return err
}

// Readyz succeeds when the controller is ready to serve (its database answers).
func (c *Client) Readyz(ctx context.Context) error {
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/readyz"}, nil)
	return err
}

// OpenAPI returns the controller's OpenAPI document.
func (c *Client) OpenAPI(ctx context.Context) (json.RawMessage, error) {
	var out json.RawMessage
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/api/v1/openapi.json"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}
