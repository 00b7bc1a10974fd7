package api

import (
	"encoding/json"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

var (
	openapiOnce sync.Once
	openapiDoc  []byte
)

func (s *Server) openapi(w http.ResponseWriter, _ *http.Request, _ Principal) error {
	openapiOnce.Do(func() { openapiDoc, _ = json.MarshalIndent(s.buildOpenAPI(), "", "  ") })
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openapiDoc)
	return nil
}

var pathParamRE = regexp.MustCompile(`\{([a-z_]+)\}`)

// optionalBodies are the routes whose request body may be left out (a drain without a
// maintenance notice).
var optionalBodies = map[string]bool{"POST /api/v1/admin/nodes/{id}/drain": true}

// buildOpenAPI derives the OpenAPI 3.1 document from the route table and the apiv1 types by
// reflection, so the document cannot drift from the handlers.
func (s *Server) buildOpenAPI() map[string]any {
	g := &schemaGen{defs: map[string]any{}}
	paths := map[string]map[string]any{}
	for _, rt := range s.routeTable {
		op := map[string]any{"summary": rt.summary, "operationId": operationID(rt.method, rt.path)}
		if rt.need != public {
			op["security"] = []map[string][]string{{"bearer": {}}}
		}
		var params []map[string]any
		for _, m := range pathParamRE.FindAllStringSubmatch(rt.path, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]string{"type": "string"}})
		}
		if rt.method == "POST" && rt.path == "/api/v1/allocations" {
			params = append(params, map[string]any{"name": "Idempotency-Key", "in": "header", "required": false,
				"schema": map[string]any{"type": "string", "maxLength": 128}})
		}
		if params != nil {
			op["parameters"] = params
		}
		if rt.req != nil {
			op["requestBody"] = map[string]any{"required": !optionalBodies[rt.method+" "+rt.path], "content": map[string]any{
				"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(rt.req))}}}
		}
		ok := map[string]any{"description": http.StatusText(rt.status)}
		if rt.resp != nil {
			ok["content"] = map[string]any{"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(rt.resp))}}
		}
		errResp := map[string]any{"description": "Error", "content": map[string]any{
			"application/json": map[string]any{"schema": map[string]string{"$ref": "#/components/schemas/Error"}}}}
		op["responses"] = map[string]any{itoa(rt.status): ok, "default": errResp}
		if paths[rt.path] == nil {
			paths[rt.path] = map[string]any{}
		}
		paths[rt.path][strings.ToLower(rt.method)] = op
	}
	g.defs["Error"] = map[string]any{"type": "object", "required": []string{"code", "message"}, "properties": map[string]any{
		"code":    map[string]any{"type": "string", "enum": []string{"invalid_request", "unauthorized", "forbidden", "not_found", "conflict", "sku_unavailable", "payload_too_large", "unavailable", "internal", "idempotency_key_reused"}},
		"message": map[string]any{"type": "string"},
		"details": map[string]any{"type": "object", "description": "sku_unavailable carries details.reason: count_not_allowed, no_capacity, topology_fragmented, fabric_policy_blocked, node_draining, sku_inactive, no_viable_image"},
	}}
	return map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": "gpuaas controller API", "version": "v1 (" + s.version + ")"},
		"paths":   paths,
		"components": map[string]any{
			"schemas":         g.defs,
			"securitySchemes": map[string]any{"bearer": map[string]string{"type": "http", "scheme": "bearer"}},
		},
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func operationID(method, path string) string {
	p := strings.TrimPrefix(path, "/api/v1")
	p = pathParamRE.ReplaceAllString(p, "by_$1")
	p = strings.NewReplacer("/", "_", "-", "_", ".", "_").Replace(p)
	return strings.ToLower(method) + p
}

type schemaGen struct{ defs map[string]any }

var (
	timeType = reflect.TypeOf(time.Time{})
	rawType  = reflect.TypeOf(json.RawMessage{})
)

func (g *schemaGen) schema(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{"description": "arbitrary JSON"}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		name := t.Name()
		if i := strings.IndexByte(name, '['); i >= 0 { // List[pkg.T] -> ListT
			name = name[:i] + name[strings.LastIndexByte(name, '.')+1:len(name)-1]
		}
		if name != "" {
			if _, ok := g.defs[name]; !ok {
				g.defs[name] = map[string]any{} // break recursion
				g.defs[name] = g.object(t)
			}
			return map[string]any{"$ref": "#/components/schemas/" + name}
		}
		return g.object(t)
	}
	return map[string]any{}
}

func (g *schemaGen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		if f.Anonymous {
			if sub, ok := g.object(f.Type)["properties"].(map[string]any); ok {
				for k, v := range sub {
					props[k] = v
				}
			}
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = g.schema(f.Type)
		if !strings.Contains(opts, "omitempty") && f.Type.Kind() != reflect.Pointer {
			required = append(required, name)
		}
	}
	out := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		out["required"] = required
	}
	return out
}
