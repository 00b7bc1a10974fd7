// Package skew holds the version-skew tests (its _test.go files): the previous release's
// binaries (release/PREVIOUS names its commit) built from that commit and run against this
// tree's, on one real PostgreSQL: a new controller with an old gpuaas-hostd, an old
// controller replica beside a new one on the database the new one migrated, and a rolling
// upgrade of controllers and hosts under load. See docs/upgrades.md.
package skew
