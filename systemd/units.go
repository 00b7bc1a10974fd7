// Package systemd holds gpuaas's systemd units (the *.service files beside this one),
// embedded so `gpuaasctl nodes cloud-init` can install them on a host through MAAS user-data.
package systemd

import (
	"embed"
	"sort"
)

//go:embed *.service
var files embed.FS

// Names lists the units, sorted.
func Names() []string {
	entries, _ := files.ReadDir(".")
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// Unit returns a unit file's text.
func Unit(name string) (string, error) {
	b, err := files.ReadFile(name)
	return string(b), err
}

// InstallHint is how to install and start units from an installed binary's directory.
func InstallHint(binary string, units ...string) string {
	s := "Install the systemd unit(s) and start them:\n"
	for _, u := range units {
		s += "  " + binary + " systemd-unit " + u + " | sudo tee /etc/systemd/system/" + u + " >/dev/null\n"
	}
	s += "  sudo systemctl daemon-reload\n"
	for _, u := range units {
		s += "  sudo systemctl enable --now " + u + "\n"
	}
	return s
}
