package controller

import (
	"net"
	"os"
	"strings"
	"testing"
)

func TestAdvertiseURL(t *testing.T) {
	for _, bad := range []string{"http://a:8443", "https://", "https://lb/api", "https://u:p@a:8443", "https://a:8443?x=1", "a:8443", "https://a:8443#f"} {
		if err := checkAdvertiseURL(bad); err == nil || !strings.Contains(err.Error(), "--advertise-url") {
			t.Errorf("%q accepted (%v)", bad, err)
		}
	}
	for _, good := range []string{"https://10.0.0.11:8443", "https://ctl-a.example", "https://[fd00::1]:8443/"} {
		if err := checkAdvertiseURL(good); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
	bound := &net.TCPAddr{IP: net.ParseIP("10.0.0.11"), Port: 8443}
	if u, err := advertiseURL(Config{}, bound); err != nil || u != "https://10.0.0.11:8443" {
		t.Fatalf("default from a specific address: %q %v", u, err)
	}
	if u, err := advertiseURL(Config{AdvertiseURL: "https://ctl-a.example:9443/"}, bound); err != nil || u != "https://ctl-a.example:9443" {
		t.Fatalf("explicit: %q %v", u, err)
	}
	host, _ := os.Hostname()
	for _, addr := range []string{"0.0.0.0", "::"} {
		u, err := advertiseURL(Config{}, &net.TCPAddr{IP: net.ParseIP(addr), Port: 8443})
		if err != nil || u != "https://"+net.JoinHostPort(host, "8443") {
			t.Fatalf("listening on %s: %q %v, want the hostname %s", addr, u, err, host)
		}
	}
}
