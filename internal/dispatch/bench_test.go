package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// BenchmarkDispatchLatency: 1,000 hosts long-poll at once; each iteration commits a task for
// one of them and measures commit-to-receipt latency (reported as p50/p99 ms). Real PostgreSQL.
func BenchmarkDispatchLatency(b *testing.B) {
	const hosts = 1000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.Open(ctx, pgtest.NewDatabase(b), store.Options{MaxConns: 32})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	d := dispatch.New(st, alloc.New(st, alloc.Config{}), priv, nil, dispatch.Config{})
	ids := make([]string, hosts)
	err = st.InTx(ctx, func(tx *store.Tx) error {
		for i := range ids {
			n, err := tx.CreateNode(ctx, apiv1.NodeCreate{Name: fmt.Sprintf("h%04d", i), Region: "lab"})
			if err != nil {
				return err
			}
			ids[i] = n.ID
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	type receipt struct {
		task string
		at   time.Time
	}
	got := make(chan receipt, 64)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			for ctx.Err() == nil {
				env, err := d.Poll(ctx, id, 30*time.Second)
				if err == nil && env != nil {
					got <- receipt{env.TaskID, time.Now()}
				}
			}
		}(id)
	}
	deadline := time.Now().Add(30 * time.Second)
	for d.Hub().Waiting(ids[hosts-1]) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // until the pollers are parked
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		node := ids[i%hosts]
		var taskID string
		err := st.InTx(ctx, func(tx *store.Tx) error {
			var err error
			taskID, err = tx.InsertTask(ctx, store.NewTask{NodeID: node, Type: string(task.TypeReconcile), Payload: task.Reconcile{}, TTL: time.Hour})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		committed := time.Now()
		d.Hub().Wake(node) // what the outbox worker does after commit
		r := <-got
		if r.task != taskID {
			b.Fatalf("received %s, want %s", r.task, taskID)
		}
		lat = append(lat, r.at.Sub(committed))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
	cancel()
	wg.Wait()
}
