package sshcmd

// escaper implements OpenSSH's escape sequences for an interactive session: '~' typed first
// on a line (at the start, or after Enter) starts one. "~." disconnects (the only way out of
// a hung session short of killing gpuaasctl), "~?" lists the sequences, "~~" sends one '~',
// and '~' before any other byte is sent as typed.
type escaper struct {
	midLine bool // the last byte sent was not a line end
	pending bool // a '~' at the start of a line, waiting for the next byte
}

// escapeAction is what an escape sequence asked for.
type escapeAction int

const (
	escapeNone escapeAction = iota
	escapeDisconnect
	escapeHelp
)

const escapeHelpText = "\r\nSupported escape sequences:\r\n ~.  - disconnect\r\n ~?  - this message\r\n ~~  - send the escape character by typing it twice\r\n(Note that escapes are only recognized immediately after newline.)\r\n"

// filter returns the bytes of in to send to the remote side and what an escape sequence in
// it asked for. Bytes after a disconnect are dropped.
func (e *escaper) filter(in []byte) ([]byte, escapeAction) {
	// A read that starts with ESC is a key sequence or the local terminal's answer to a query
	// the remote side sent (busybox and readline ask for the cursor position at each prompt):
	// not typing, so it leaves the line state alone and "~." after Enter still escapes.
	if !e.pending && len(in) > 0 && in[0] == 0x1b {
		return in, escapeNone
	}
	out := make([]byte, 0, len(in)+1)
	action := escapeNone
	for _, b := range in {
		if e.pending {
			e.pending = false
			switch b {
			case '.':
				return out, escapeDisconnect
			case '?':
				action = escapeHelp
				continue
			case '~':
				out = append(out, '~')
				e.midLine = true
				continue
			default:
				out = append(out, '~')
			}
		} else if b == '~' && !e.midLine {
			e.pending = true
			continue
		}
		out = append(out, b)
		e.midLine = b != '\r' && b != '\n'
	}
	return out, action
}
