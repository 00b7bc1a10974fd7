// Package hypervisor is the narrow interface hostd uses to run slice VMs, and its libvirt
// implementation over the local socket (go-libvirt, no virsh, no virt-install). Runtimes
// depend on the interface; tests of runtimes use the real libvirtd in the lab.
package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// State is a domain's run state.
type State string

// States.
const (
	Running  State = "running"
	ShutOff  State = "shutoff"
	Paused   State = "paused"
	Other    State = "other"
	NotFound State = "not_found"
)

// Active says whether a domain in this state may still run guest code or hold its disks:
// anything but shut off or absent (paused, being shut down, blocked, crashed, suspended).
func (s State) Active() bool { return s != ShutOff && s != NotFound }

// Hypervisor defines, starts, stops and removes domains.
type Hypervisor interface {
	Define(xml string) error
	Start(name string) error
	Shutdown(name string) error // graceful (ACPI)
	Destroy(name string) error  // hard stop
	Undefine(name string) error // with NVRAM
	State(name string) (State, error)
	List(prefix string) ([]string, error)
	Close() error
}

// ErrNotFound is a domain that does not exist.
var ErrNotFound = errors.New("domain not found")

// Libvirt talks to libvirtd over its local socket.
type Libvirt struct{ l *libvirt.Libvirt }

// DefaultSocket is libvirtd's system socket.
const DefaultSocket = "/run/libvirt/libvirt-sock"

// Connect opens qemu:///system on the socket.
func Connect(socket string) (*Libvirt, error) {
	if socket == "" {
		socket = DefaultSocket
	}
	l := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(socket), dialers.WithLocalTimeout(5*time.Second)))
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, fmt.Errorf("hypervisor: connect %s: %w", socket, err)
	}
	return &Libvirt{l: l}, nil
}

// Close disconnects.
func (h *Libvirt) Close() error { return h.l.Disconnect() }

func (h *Libvirt) lookup(name string) (libvirt.Domain, error) {
	d, err := h.l.DomainLookupByName(name)
	if err != nil {
		if isNoDomain(err) {
			return d, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return d, fmt.Errorf("hypervisor: lookup %s: %w", name, err)
	}
	return d, nil
}

func isNoDomain(err error) bool {
	var le libvirt.Error
	if errors.As(err, &le) && le.Code == uint32(libvirt.ErrNoDomain) {
		return true
	}
	return strings.Contains(err.Error(), "Domain not found")
}

// Define defines (or redefines) a persistent domain from XML.
func (h *Libvirt) Define(xml string) error {
	if _, err := h.l.DomainDefineXML(xml); err != nil {
		return fmt.Errorf("hypervisor: define: %w", err)
	}
	return nil
}

// Start boots a defined domain (a running one is left alone: idempotent).
func (h *Libvirt) Start(name string) error {
	d, err := h.lookup(name)
	if err != nil {
		return err
	}
	if st, _ := h.State(name); st == Running {
		return nil
	}
	if err := h.l.DomainCreate(d); err != nil {
		return fmt.Errorf("hypervisor: start %s: %w", name, err)
	}
	return nil
}

// Shutdown asks the guest to power off (ACPI).
func (h *Libvirt) Shutdown(name string) error {
	d, err := h.lookup(name)
	if err != nil {
		return err
	}
	if err := h.l.DomainShutdown(d); err != nil {
		return fmt.Errorf("hypervisor: shutdown %s: %w", name, err)
	}
	return nil
}

// Destroy hard-stops an active domain (running, paused, being shut down...; a stopped one is
// left alone).
func (h *Libvirt) Destroy(name string) error {
	d, err := h.lookup(name)
	if err != nil {
		return err
	}
	if st, err := h.State(name); err == nil && !st.Active() {
		return nil
	}
	if err := h.l.DomainDestroy(d); err != nil {
		return fmt.Errorf("hypervisor: destroy %s: %w", name, err)
	}
	return nil
}

// Undefine removes the domain definition and its NVRAM (a missing domain is success).
func (h *Libvirt) Undefine(name string) error {
	d, err := h.lookup(name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := h.l.DomainUndefineFlags(d, libvirt.DomainUndefineNvram); err != nil {
		// Older libvirt without NVRAM support for this domain: plain undefine.
		if err2 := h.l.DomainUndefineFlags(d, 0); err2 != nil {
			return fmt.Errorf("hypervisor: undefine %s: %w", name, err)
		}
	}
	return nil
}

// State reports the domain's state.
func (h *Libvirt) State(name string) (State, error) {
	d, err := h.lookup(name)
	if errors.Is(err, ErrNotFound) {
		return NotFound, nil
	}
	if err != nil {
		return Other, err
	}
	st, _, err := h.l.DomainGetState(d, 0)
	if err != nil {
		return Other, fmt.Errorf("hypervisor: state %s: %w", name, err)
	}
	switch libvirt.DomainState(st) {
	case libvirt.DomainRunning:
		return Running, nil
	case libvirt.DomainShutoff:
		return ShutOff, nil
	case libvirt.DomainPaused:
		return Paused, nil
	}
	return Other, nil
}

// List names the defined domains whose names start with prefix (reconcile finds orphans).
func (h *Libvirt) List(prefix string) ([]string, error) {
	ds, _, err := h.l.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("hypervisor: list: %w", err)
	}
	var out []string
	for _, d := range ds {
		if strings.HasPrefix(d.Name, prefix) {
			out = append(out, d.Name)
		}
	}
	return out, nil
}

// Console streams a running domain's serial console output into out until ctx ends or the
// console closes (virDomainOpenConsole). It uses a connection of its own, closed to stop the
// stream: go-libvirt's console stream is output-only, so the relay's console is read-only.
func Console(ctx context.Context, socket, name string, out io.Writer) error {
	h, err := Connect(socket)
	if err != nil {
		return err
	}
	defer h.Close()
	d, err := h.lookup(name)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- h.l.DomainOpenConsole(d, libvirt.OptString{}, out, 0) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("hypervisor: console of %s: %w", name, err)
		}
		return nil
	case <-ctx.Done():
		_ = h.l.Disconnect() // ends the stream
		<-done
		return nil
	}
}
