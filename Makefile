# gpuaas — build, test, demo. `make demo` and `make test` are the first two commands.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS := -X github.com/gpuaas/gpuaas/internal/buildinfo.Version=$(VERSION) -X github.com/gpuaas/gpuaas/internal/buildinfo.Commit=$(COMMIT)
BINARIES := gpuaasctl gpuaas-hostd gpuaas-controller
# Packages with concurrency worth the race detector; the rest run without it to keep CI fast.
RACE_PKGS := ./internal/alloc/... ./internal/api/... ./internal/store/... ./internal/sched/... ./internal/pgserver/... ./internal/dispatch/... ./internal/agent/...
TEST_FLAGS ?= -count=1 -timeout 20m
# Native Go fuzz targets as package:Target (internal/rules checks every FuzzXxx is listed).
# `make fuzz` runs each for FUZZTIME; `make test` runs each for TEST_FUZZTIME executions
# (empty: none; the first run also builds the fuzz-instrumented standard library and
# dependencies). make test counts executions (Nx) rather than seconds: a duration budget
# races Go's own fuzz coordinator at its deadline (golang/go#75804, fixed in Go 1.27) and
# fails with a bare "context deadline exceeded" and no failing input; an execution count
# has no deadline to race.
FUZZ_TARGETS := internal/api:FuzzDecodeBody internal/api:FuzzQueryParams internal/task:FuzzVerify \
	internal/task:FuzzSignedMutation internal/topology:FuzzDiscover internal/disk:FuzzProbeOutput \
	internal/dhcpd:FuzzReply internal/cloudinit:FuzzRender internal/cloudinit:FuzzRenderHost \
	internal/cli/slots:FuzzReadSlotMap internal/store:FuzzIsUUID
FUZZTIME ?= 30s
TEST_FUZZTIME ?= 5000x

PREFIX ?= /usr/local
.PHONY: install release bench-quick all build test test-race test-rest demo lab lab-faults lab-libvirtd lab-host bench soak lint completions deps clean fuzz

all: build

build:
	@mkdir -p bin
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...
	@echo "built: $(addprefix bin/,$(BINARIES))"

# release builds static binaries (no cgo) with version info into bin/release/.
release:
	@mkdir -p bin/release
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/release/ ./cmd/...
	@echo "built static: $(addprefix bin/release/,$(BINARIES))"

# install puts the static binaries in $(PREFIX)/bin and prints how to install the units.
install: release
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(addprefix bin/release/,$(BINARIES)) $(DESTDIR)$(PREFIX)/bin/
	@echo; bin/release/gpuaas-controller systemd-unit; echo; bin/release/gpuaas-hostd systemd-unit

# deps checks (and, as root, installs and starts) what tests and the demo need from Debian:
# PostgreSQL and validators (.ci/deps), libvirt + QEMU + OVMF with libvirtd running (.ci/hypervisor).
deps:
	@bash .ci/deps
	@bash .ci/hypervisor

test: deps
	$(GO) vet ./...
	$(GO) test $(TEST_FLAGS) -race $(RACE_PKGS)
	$(GO) test $(TEST_FLAGS) -skip '^TestDBFailover' $$($(GO) list ./... | grep -v -E '/internal/(alloc|api|store|sched|pgserver|dispatch|agent|soak)(/|$$)')
	$(MAKE) --no-print-directory failover
	SOAK_REPORT=$(CURDIR)/bin/soak $(GO) test $(TEST_FLAGS) -v ./internal/soak
	@if [ -n "$(TEST_FUZZTIME)" ]; then $(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME); fi
	@# Restarts libvirtd under running VMs: alone, after every other test.
	$(MAKE) --no-print-directory lab-libvirtd

# fuzz runs every fuzz target for FUZZTIME (go test -fuzz takes one target per run); a
# failing input lands in the package's testdata/fuzz/FuzzXxx/: fix the bug, keep the input.
# With a duration FUZZTIME, a run that fails only with golang/go#75804's bare "context
# deadline exceeded" and writes no failing input is reported as that race and not a finding;
# any other failure, or a new file under testdata/fuzz, fails.
fuzz:
	@log=$$(mktemp); trap 'rm -f $$log' EXIT; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; corpus=$$pkg/testdata/fuzz/$$fn; \
		before=$$(ls $$corpus 2>/dev/null | wc -l); \
		echo "fuzz $$t for $(FUZZTIME)"; \
		$(GO) test -vet=off -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$pkg 2>&1 | tee $$log; \
		rc=$${PIPESTATUS[0]}; [ $$rc -eq 0 ] && continue; \
		after=$$(ls $$corpus 2>/dev/null | wc -l); \
		if [ "$$after" = "$$before" ] && grep -qx '    context deadline exceeded' $$log && \
			[ $$(grep -c -e '^--- FAIL' -e 'panic:' -e 'Failing input' $$log) -eq 1 ]; then \
			echo "fuzz $$t: Go's fuzz coordinator raced its own -fuzztime deadline (golang/go#75804); no failing input was written, so this is not a finding"; \
		else exit $$rc; fi; \
	done

demo: deps build
	$(GO) run ./internal/demo --bin bin $(ARGS)

# lab boots a real slice VM on libvirtd + QEMU (root; see docs/slice-runtime.md) and prints
# its phase timings.
lab: deps
	$(GO) test -count=1 -v -run 'TestScripts/lab_vm' ./internal/e2e | grep -E 'slice\.vm_(provision|release) #|^\s*--- |^(ok|FAIL)'

# lab-faults kills gpuaas-hostd (SIGKILL) inside every provisioning and release phase of
# lab slice VMs (root, libvirtd; ~9 VM boots, tens of minutes; docs/testing.md) and prints
# the per-kill outcome table (also written to bin/lab-faults.md).
lab-faults: deps
	@mkdir -p bin
	set -o pipefail; GPUAAS_LAB_FAULTS=1 LABFAULTS_OUT=$(CURDIR)/bin/lab-faults.jsonl LABFAULTS_TABLE=$(CURDIR)/bin/lab-faults.md \
		$(GO) test -count=1 -timeout 90m -v -run 'TestLabFaults$$' ./internal/e2e 2>&1 | tee bin/lab-faults.log | \
		grep -E 'kill -9 of hostd|slice\.vm_(provision|release): task|lab faults:|^\s*\||^\s*--- |^(ok|FAIL)'

# lab-host runs hostd's production libvirt runtime on emulated hardware (root; docs/slice-
# runtime.md "The lab host"): builds a Debian host image once (debootstrap, cached under
# /var/cache/gpuaas/lab-host), boots it under QEMU with an IOMMU, NUMA expander buses, GPU
# stand-ins, NVMe slot disks and an SR-IOV fabric stand-in, and drives discovery, approval,
# provision, reconcile, release with an NVMe-native wipe and the failure paths from the
# controller on this machine. Prints each step's timing; log in bin/lab-host.log.
lab-host: deps
	@mkdir -p bin/lab-host
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/lab-host/ ./cmd/gpuaas-hostd
	set -o pipefail; GPUAAS_LAB_HOST=1 GPUAAS_LABHOST_HOSTD=$(CURDIR)/bin/lab-host/gpuaas-hostd \
		$(GO) test -count=1 -timeout 150m -v -run 'TestLabHost$$' ./internal/e2e 2>&1 | tee bin/lab-host.log | \
		grep -E 'lab host:|^\s*> (labhost|exec gpuaasctl (alloc|topology|nodes reconcile|slots approve))|slice\.vm_(provision|release) #|^\s*--- |^(ok|FAIL)'

# lab-libvirtd restarts the machine's libvirtd under a running domain and a running lab slice
# VM and checks hostd carries on (root, libvirtd started with `libvirtd -d`). It runs alone:
# a restart would break any other lab test's virsh call in flight (make test runs it last).
lab-libvirtd: deps
	GPUAAS_LAB_LIBVIRTD_RESTART=1 $(GO) test -count=1 -v -run 'TestCallsSurviveALibvirtdRestart$$' ./internal/hypervisor
	GPUAAS_LAB_LIBVIRTD_RESTART=1 $(GO) test -count=1 -timeout 20m -v -run 'TestScripts/lab_vm_libvirtd_restart$$' ./internal/e2e

# bench measures the performance targets (docs/performance.md) side by side in one run (these
# machines are noisy: only ratios within a run are stable) and writes bench/report.md + JSON +
# plots; about 31 minutes on 2 cores (BENCH_ARGS=--seeds=1 --demand-seeds=1: fewer placement seeds, shorter).
# BENCH_ARGS=--profile also saves controller CPU profiles.
bench: deps build
	$(GO) test -run '^$$' -bench . -benchmem ./internal/sched/... ./internal/alloc/... ./internal/dispatch/...
	$(GO) run ./internal/bench/report --bin bin --out bench $(BENCH_ARGS)

# bench-quick is the day-to-day subset (< 3 minutes): smaller fleets, shorter runs.
bench-quick: deps build
	$(GO) run ./internal/bench/report --quick --bin bin --out bench $(BENCH_ARGS)

# soak is the long load soak (docs/soak.md): 64 HTTPS clients, 200 enrolled sim hostd
# processes, random kill -9 of hostd, SQL invariants throughout; report in soak/ (JSON +
# text). `make test` runs the same soak with 3 minutes of load. SOAK_DURATION=2h make soak for longer.
SOAK_DURATION ?= 30m
soak: deps build
	@mkdir -p soak
	set -o pipefail; SOAK_BIN=$(CURDIR)/bin SOAK_DURATION=$(SOAK_DURATION) SOAK_REPORT=$(CURDIR)/soak $(GO) test -count=1 -timeout 0 -v -run 'TestSoak$$' ./internal/soak | tee soak/soak.log

# failover loses the PostgreSQL primary under load and promotes its streaming standby
# (synchronous and asynchronous), then brings the old primary back on its own
# (docs/database-failover.md) and prints what it measured: the
# unavailability window, readiness, wake-ups, what the asynchronous standby lost. 1.5 to 2
# minutes on a shared 2-core machine; `make test` runs it after the other packages (whose
# run skips these tests), so their PostgreSQL pairs do not compete with the other fault tests.
.PHONY: failover
failover: deps
	set -o pipefail; $(GO) test -count=1 -timeout 20m -v -run 'TestDBFailover' ./internal/faults 2>&1 | \
		grep -E 'failover(_[a-z]+)?_test\.go:[0-9]+:|^\s*--- |^(ok|FAIL)'

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...

completions: build
	@mkdir -p completions
	bin/gpuaasctl completion bash > completions/gpuaasctl.bash
	bin/gpuaasctl completion zsh > completions/_gpuaasctl
	bin/gpuaasctl completion fish > completions/gpuaasctl.fish
	bin/gpuaasctl completion powershell > completions/gpuaasctl.ps1
	@echo "wrote completions/"

clean:
	rm -rf bin
