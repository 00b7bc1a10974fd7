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
	"sync"
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
	// PCIHostdevs lists the PCI addresses (0000:21:00.0) passed through to the domain as it
	// runs now (live) and in its persistent definition, which the next start uses (config).
	PCIHostdevs(name string) (live, config []string, err error)
	Close() error
}

// ErrNotFound is a domain that does not exist.
var ErrNotFound = errors.New("domain not found")

// Libvirt talks to libvirtd over its local socket. libvirtd may restart under it (an
// upgrade, a crash, an operator): a call that finds the connection gone dials again and is
// run once more on the new connection, so hostd carries on without a restart of its own.
// Every call here is safe to repeat (define is a redefine, start and destroy look at the
// state first, undefine of a missing domain is success).
type Libvirt struct {
	socket string
	mu     sync.Mutex
	l      *libvirt.Libvirt
}

// DefaultSocket is libvirtd's system socket.
const DefaultSocket = "/run/libvirt/libvirt-sock"

// dropWait is how long a failed call waits to learn whether its connection dropped.
const dropWait = 2 * time.Second

// Connect opens qemu:///system on the socket.
func Connect(socket string) (*Libvirt, error) {
	if socket == "" {
		socket = DefaultSocket
	}
	l, err := dial(socket)
	if err != nil {
		return nil, fmt.Errorf("hypervisor: connect %s: %w", socket, err)
	}
	return &Libvirt{socket: socket, l: l}, nil
}

func dial(socket string) (*libvirt.Libvirt, error) {
	l := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(socket), dialers.WithLocalTimeout(5*time.Second)))
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, err
	}
	return l, nil
}

// Close disconnects.
func (h *Libvirt) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.l.IsConnected() {
		return nil
	}
	return h.l.Disconnect()
}

// conn is the current connection, dialed again if libvirtd dropped it.
func (h *Libvirt) conn() (*libvirt.Libvirt, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.l.IsConnected() {
		return h.l, nil
	}
	l, err := dial(h.socket)
	if err != nil {
		return nil, fmt.Errorf("hypervisor: libvirtd connection lost; reconnecting to %s: %w", h.socket, err)
	}
	h.l = l
	return l, nil
}

// do runs fn on a live connection. An error that is not libvirtd's answer (a libvirt.Error)
// may be the connection dropping: once the connection says it is gone, fn runs once more on
// a new one.
func (h *Libvirt) do(fn func(l *libvirt.Libvirt) error) error {
	l, err := h.conn()
	if err != nil {
		return err
	}
	err = fn(l)
	var le libvirt.Error
	if err == nil || errors.As(err, &le) || errors.Is(err, ErrNotFound) {
		return err // libvirtd answered
	}
	select {
	case <-l.Disconnected():
	case <-time.After(dropWait):
		return err // the connection is up: a genuine failure
	}
	l, cerr := h.conn()
	if cerr != nil {
		return errors.Join(err, cerr)
	}
	return fn(l)
}

func (h *Libvirt) lookup(l *libvirt.Libvirt, name string) (libvirt.Domain, error) {
	d, err := l.DomainLookupByName(name)
	if err != nil {
		if isNoDomain(err) {
			return d, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return d, err
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
	err := h.do(func(l *libvirt.Libvirt) error { _, err := l.DomainDefineXML(xml); return err })
	if err != nil {
		return fmt.Errorf("hypervisor: define: %w", err)
	}
	return nil
}

// Start boots a defined domain (a running one is left alone: idempotent).
func (h *Libvirt) Start(name string) error {
	err := h.do(func(l *libvirt.Libvirt) error {
		d, err := h.lookup(l, name)
		if err != nil {
			return err
		}
		if st, _ := h.state(l, d); st == Running {
			return nil
		}
		return l.DomainCreate(d)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("hypervisor: start %s: %w", name, err)
	}
	return err
}

// Shutdown asks the guest to power off (ACPI).
func (h *Libvirt) Shutdown(name string) error {
	err := h.do(func(l *libvirt.Libvirt) error {
		d, err := h.lookup(l, name)
		if err != nil {
			return err
		}
		return l.DomainShutdown(d)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("hypervisor: shutdown %s: %w", name, err)
	}
	return err
}

// Destroy hard-stops an active domain (running, paused, being shut down...; a stopped one is
// left alone).
func (h *Libvirt) Destroy(name string) error {
	err := h.do(func(l *libvirt.Libvirt) error {
		d, err := h.lookup(l, name)
		if err != nil {
			return err
		}
		if st, err := h.state(l, d); err == nil && !st.Active() {
			return nil
		}
		return l.DomainDestroy(d)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("hypervisor: destroy %s: %w", name, err)
	}
	return err
}

// Undefine removes the domain definition and its NVRAM (a missing domain is success).
func (h *Libvirt) Undefine(name string) error {
	err := h.do(func(l *libvirt.Libvirt) error {
		d, err := h.lookup(l, name)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := l.DomainUndefineFlags(d, libvirt.DomainUndefineNvram); err != nil {
			// Older libvirt without NVRAM support for this domain: plain undefine.
			if err2 := l.DomainUndefineFlags(d, 0); err2 != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hypervisor: undefine %s: %w", name, err)
	}
	return nil
}

// State reports the domain's state.
func (h *Libvirt) State(name string) (State, error) {
	st := Other
	err := h.do(func(l *libvirt.Libvirt) error {
		d, err := h.lookup(l, name)
		if errors.Is(err, ErrNotFound) {
			st = NotFound
			return nil
		}
		if err != nil {
			return err
		}
		st, err = h.state(l, d)
		return err
	})
	if err != nil {
		return Other, fmt.Errorf("hypervisor: state %s: %w", name, err)
	}
	return st, nil
}

func (h *Libvirt) state(l *libvirt.Libvirt, d libvirt.Domain) (State, error) {
	st, _, err := l.DomainGetState(d, 0)
	if err != nil {
		return Other, err
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
	var out []string
	err := h.do(func(l *libvirt.Libvirt) error {
		ds, _, err := l.ConnectListAllDomains(1, 0)
		if err != nil {
			return err
		}
		out = out[:0]
		for _, d := range ds {
			if strings.HasPrefix(d.Name, prefix) {
				out = append(out, d.Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hypervisor: list: %w", err)
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
	d, err := h.lookup(h.l, name)
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
