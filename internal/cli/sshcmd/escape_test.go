package sshcmd

import "testing"

// TestEscapeSequences: "~." after a line end (or first) disconnects, "~~" sends a tilde, a
// tilde mid-line or before another byte is sent as typed, and a sequence split across reads
// still works.
func TestEscapeSequences(t *testing.T) {
	for _, tc := range []struct {
		reads  []string
		sent   string
		action escapeAction
	}{
		{[]string{"~."}, "", escapeDisconnect},
		{[]string{"ls\r~."}, "ls\r", escapeDisconnect},
		{[]string{"ls\r~", "."}, "ls\r", escapeDisconnect},
		{[]string{"echo a~.b\r"}, "echo a~.b\r", escapeNone},
		{[]string{"~~x"}, "~x", escapeNone},
		{[]string{"~x"}, "~x", escapeNone},
		{[]string{"\n~?"}, "\n", escapeHelp},
		{[]string{"\r~.rest"}, "\r", escapeDisconnect},
		// The terminal's answer to the remote prompt's cursor query lands after Enter.
		{[]string{"ls\r", "\x1b[45;1R", "~."}, "ls\r\x1b[45;1R", escapeDisconnect},
	} {
		var e escaper
		sent, action := "", escapeNone
		for _, r := range tc.reads {
			out, a := e.filter([]byte(r))
			sent += string(out)
			if a != escapeNone {
				action = a
			}
		}
		if sent != tc.sent || action != tc.action {
			t.Errorf("%q: sent %q action %d, want %q %d", tc.reads, sent, action, tc.sent, tc.action)
		}
	}
}
