package hypervisor

import (
	"encoding/xml"
	"fmt"

	"github.com/digitalocean/go-libvirt"
)

// PCIHostdevs reads the domain's live and persistent XML and lists their PCI hostdevs'
// source addresses.
func (h *Libvirt) PCIHostdevs(name string) (live, config []string, err error) {
	var liveXML, configXML string
	err = h.do(func(l *libvirt.Libvirt) error {
		d, err := h.lookup(l, name)
		if err != nil {
			return err
		}
		if liveXML, err = l.DomainGetXMLDesc(d, 0); err != nil {
			return err
		}
		configXML, err = l.DomainGetXMLDesc(d, libvirt.DomainXMLInactive)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("hypervisor: hostdevs of %s: %w", name, err)
	}
	if live, err = ParsePCIHostdevs(liveXML); err != nil {
		return nil, nil, err
	}
	config, err = ParsePCIHostdevs(configXML)
	return live, config, err
}

// ParsePCIHostdevs lists the source addresses of a domain XML's PCI hostdevs.
func ParsePCIHostdevs(domainXML string) ([]string, error) {
	var d struct {
		Hostdevs []struct {
			Type   string `xml:"type,attr"`
			Source struct {
				Address struct {
					Domain   string `xml:"domain,attr"`
					Bus      string `xml:"bus,attr"`
					Slot     string `xml:"slot,attr"`
					Function string `xml:"function,attr"`
				} `xml:"address"`
			} `xml:"source"`
		} `xml:"devices>hostdev"`
	}
	if err := xml.Unmarshal([]byte(domainXML), &d); err != nil {
		return nil, fmt.Errorf("hypervisor: domain XML: %w", err)
	}
	out := []string{}
	for _, hd := range d.Hostdevs {
		if hd.Type != "pci" {
			continue
		}
		a := hd.Source.Address
		var dom, bus, slot, fn uint64
		if _, err := fmt.Sscanf(a.Domain+" "+a.Bus+" "+a.Slot+" "+a.Function, "0x%x 0x%x 0x%x 0x%x", &dom, &bus, &slot, &fn); err != nil {
			return nil, fmt.Errorf("hypervisor: hostdev address %+v: %w", a, err)
		}
		out = append(out, fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, slot, fn))
	}
	return out, nil
}
