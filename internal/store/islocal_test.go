package store_test

import (
	"testing"

	"github.com/gpuaas/gpuaas/internal/store"
)

func TestIsLocalDatabase(t *testing.T) {
	for url, want := range map[string]bool{
		"":                                       true, // the embedded cluster
		"host=/var/run/postgresql dbname=gpuaas": true,
		"postgres://gpuaas@localhost/gpuaas":     true,
		"postgres://gpuaas@127.0.0.1:5432/gpuaas":          true,
		"postgres://gpuaas@[::1]/gpuaas":                   true,
		"postgres://gpuaas@db.example:5432/gpuaas":         false,
		"postgres://gpuaas@10.0.0.5/gpuaas":                false,
		"host=db-a.internal,localhost dbname=gpuaas":       false, // the first host is the one dialled first
		"postgres://gpuaas@%zz/gpuaas":                     false, // unparsable: remote; opening the pool reports it
		"host=/tmp/pg port=5433 user=postgres dbname=test": true,
	} {
		if got := store.IsLocalDatabase(url); got != want {
			t.Errorf("IsLocalDatabase(%q) = %v, want %v", url, got, want)
		}
	}
}
