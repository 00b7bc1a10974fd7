// Package faults holds the multi-process fault tests (its _test.go files): two real
// gpuaas-controller replicas on one PostgreSQL, real gpuaas-hostd processes (sim runtime:
// the VM is the only simulated part), SIGKILL of controllers, a PostgreSQL restart under
// load, the loss of a PostgreSQL primary with its streaming standby promoted (synchronous
// and asynchronous; TestDBFailover*, run by `make failover`) and a TCP proxy that partitions
// hosts from the controller. Each test asserts on the
// tasks table, the allocation state machine, the SQL invariants (store.Invariants) and
// hostd's own log of the tasks it started. See docs/operations.md.
package faults
