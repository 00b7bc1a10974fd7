package api_test

import (
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

func TestWebhooksAreTenantScopedAndSecretShownOnce(t *testing.T) {
	b := setup(t)
	b.world()
	var h apiv1.Webhook
	b.must("POST", "/api/v1/webhooks", b.tenant, apiv1.WebhookCreate{URL: "https://hooks.example.com/gpuaas"}, 201, &h)
	if !strings.HasPrefix(h.Secret, "whsec_") || len(h.Secret) < 40 || h.TenantID != b.tenID {
		t.Fatalf("created: %+v", h)
	}
	var mine, theirs, all apiv1.List[apiv1.Webhook]
	b.must("GET", "/api/v1/webhooks", b.tenant, nil, 200, &mine)
	b.must("GET", "/api/v1/webhooks", b.other, nil, 200, &theirs)
	b.must("GET", "/api/v1/webhooks", b.admin, nil, 200, &all)
	if len(mine.Items) != 1 || mine.Items[0].Secret != "" || len(theirs.Items) != 0 || len(all.Items) != 1 {
		t.Fatalf("lists: mine %+v, theirs %+v, all %+v", mine.Items, theirs.Items, all.Items)
	}
	_, raw := b.do("GET", "/api/v1/webhooks", b.admin, nil)
	if strings.Contains(string(raw), h.Secret) {
		t.Fatal("a list shows the secret")
	}
	// The other tenant can neither read nor delete it.
	for _, c := range []struct{ method, path string }{{"GET", "/api/v1/webhooks/" + h.ID + "/deliveries"}, {"DELETE", "/api/v1/webhooks/" + h.ID}} {
		if code, body := b.do(c.method, c.path, b.other, nil); code != 404 {
			t.Fatalf("tenant B %s %s = %d %s", c.method, c.path, code, body)
		}
	}
	var ds apiv1.List[apiv1.WebhookDelivery]
	b.must("GET", "/api/v1/webhooks/"+h.ID+"/deliveries?status=dead", b.tenant, nil, 200, &ds)
	if code, _ := b.do("GET", "/api/v1/webhooks/"+h.ID+"/deliveries?status=lost", b.tenant, nil); code != 400 {
		t.Fatalf("bad status filter = %d", code)
	}
	b.must("DELETE", "/api/v1/webhooks/"+h.ID, b.tenant, nil, 200, nil)
	b.must("DELETE", "/api/v1/webhooks/"+h.ID, b.tenant, nil, 200, nil) // a retried delete
	b.must("GET", "/api/v1/webhooks", b.tenant, nil, 200, &mine)
	if len(mine.Items) != 0 {
		t.Fatalf("deleted webhook still listed: %+v", mine.Items)
	}
	if code, _ := b.do("GET", "/api/v1/webhooks/"+h.ID+"/deliveries", b.tenant, nil); code != 404 {
		t.Fatalf("deliveries of a deleted webhook = %d", code)
	}
}

func TestWebhookCreateRefusesBadInput(t *testing.T) {
	b := setup(t)
	b.world()
	bad := map[string]struct {
		token string
		body  any
		code  int
	}{
		"plain http":        {b.tenant, apiv1.WebhookCreate{URL: "http://hooks.example.com/x"}, 400},
		"loopback":          {b.tenant, apiv1.WebhookCreate{URL: "https://127.0.0.1:9000/x"}, 400},
		"metadata service":  {b.tenant, apiv1.WebhookCreate{URL: "https://169.254.169.254/latest"}, 400},
		"credentials":       {b.tenant, apiv1.WebhookCreate{URL: "https://u:p@hooks.example.com/"}, 400},
		"no url":            {b.tenant, apiv1.WebhookCreate{}, 400},
		"unknown field":     {b.tenant, `{"url":"https://hooks.example.com","events":["x"]}`, 400},
		"another tenant":    {b.other, apiv1.WebhookCreate{URL: "https://hooks.example.com/x", TenantID: b.tenID}, 403},
		"admin, no tenant":  {b.admin, apiv1.WebhookCreate{URL: "https://hooks.example.com/x"}, 400},
		"admin, no such":    {b.admin, apiv1.WebhookCreate{URL: "https://hooks.example.com/x", TenantID: "00000000-0000-0000-0000-000000000001"}, 400},
		"admin, not a uuid": {b.admin, apiv1.WebhookCreate{URL: "https://hooks.example.com/x", TenantID: "acme"}, 400},
	}
	for name, c := range bad {
		code, body := b.do("POST", "/api/v1/webhooks", c.token, c.body)
		if code != c.code {
			t.Errorf("%s: %d, want %d: %s", name, code, c.code, body)
		}
	}
	var all apiv1.List[apiv1.Webhook]
	b.must("GET", "/api/v1/webhooks", b.admin, nil, 200, &all)
	if len(all.Items) != 0 {
		t.Fatalf("refused requests left webhooks: %+v", all.Items)
	}
	b.must("POST", "/api/v1/webhooks", b.admin, apiv1.WebhookCreate{URL: "https://hooks.example.com/x", TenantID: b.tenID}, 201, nil)
	for range 9 {
		b.must("POST", "/api/v1/webhooks", b.tenant, apiv1.WebhookCreate{URL: "https://hooks.example.com/y"}, 201, nil)
	}
	if code, body := b.do("POST", "/api/v1/webhooks", b.tenant, apiv1.WebhookCreate{URL: "https://hooks.example.com/z"}); code != 409 {
		t.Fatalf("11th webhook: %d %s", code, body)
	}
}
