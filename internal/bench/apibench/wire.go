package apibench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// wire is the load generator's API client: one HTTPS (HTTP/1.1, keep-alive) connection
// driven by its worker, as wrk or pgbench drive theirs. It writes prebuilt requests straight
// to the TLS connection and reads each answer with net/http's response parser, where
// net/http's Transport would hand every request to its connection's read and write
// goroutines and back (about half of the load generator's CPU per pair, which on a 2-core
// machine the controller and PostgreSQL lose). What the controller receives and answers is
// what any client's request gets: the same headers, bearer token, JSON body and path.
//
// It checks every answer: status, a complete body, and (create) the new allocation's id.
type wire struct {
	addr   string // host:port
	tlsCfg *tls.Config
	host   string // Host header
	prefix string // base path, e.g. "" or "/gpuaas"
	head   string // headers every request carries (ends in "\r\n")
	create []byte // the whole create request

	conn net.Conn
	br   *bufio.Reader
	body []byte // the last answer's body (reused)
}

// requestTimeout bounds one request when the context has no deadline, as the CLI client's
// Timeout does: a controller that stops answering fails the run instead of hanging it.
const requestTimeout = 60 * time.Second

// maxAnswer bounds an answer's body, as client.MaxResponseBytes does the CLI's.
const maxAnswer = client.MaxResponseBytes

// newWire prepares a connection to server (https://host:port[/prefix]) trusting caFile,
// authenticating with token. It dials on first use.
func newWire(server, caFile, token string) (*wire, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("apibench: %q is not an https://host:port address", server)
	}
	if strings.ContainsAny(token, "\r\n") || token == "" {
		return nil, fmt.Errorf("apibench: the API token is empty or spans lines")
	}
	tlsCfg, err := pki.ClientTLSConfig(caFile)
	if err != nil {
		return nil, err
	}
	tlsCfg.NextProtos = []string{"http/1.1"}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "443")
	}
	w := &wire{addr: addr, tlsCfg: tlsCfg, host: u.Host, prefix: u.EscapedPath()}
	w.head = "Host: " + w.host + "\r\nUser-Agent: gpuaas-bench\r\nAccept: application/json\r\nAuthorization: Bearer " + token + "\r\n"
	body, err := json.Marshal(apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: GPUs})
	if err != nil {
		return nil, err
	}
	w.create = []byte("POST " + w.prefix + "/api/v1/allocations HTTP/1.1\r\n" + w.head +
		"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
	return w, nil
}

// Create asks for one allocation and returns its id.
func (w *wire) Create(ctx context.Context) (string, error) {
	status, err := w.roundTrip(ctx, w.create)
	if err != nil {
		return "", err
	}
	if status != http.StatusCreated && status != http.StatusOK {
		return "", w.apiError(status)
	}
	var a struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(w.body, &a); err != nil || a.ID == "" {
		return "", fmt.Errorf("apibench: create answered %d without an allocation id: %.200s", status, w.body)
	}
	return a.ID, nil
}

// Release releases allocation id and checks the answer names it.
func (w *wire) Release(ctx context.Context, id string) error {
	req := "POST " + w.prefix + "/api/v1/allocations/" + url.PathEscape(id) + "/release HTTP/1.1\r\n" + w.head + "Content-Length: 0\r\n\r\n"
	status, err := w.roundTrip(ctx, []byte(req))
	if err != nil {
		return err
	}
	if status != http.StatusOK && status != http.StatusAccepted {
		return w.apiError(status)
	}
	var a struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(w.body, &a); err != nil || a.ID != id {
		return fmt.Errorf("apibench: release of %s answered %d for another allocation: %.200s", id, status, w.body)
	}
	return nil
}

// Close closes the connection.
func (w *wire) Close() {
	if w.conn != nil {
		w.conn.Close()
		w.conn, w.br = nil, nil
	}
}

// roundTrip writes req and reads the answer's status and body (into w.body). A connection
// the server closed before answering is redialled once: the request was not read, since
// the controller answers every request it reads.
func (w *wire) roundTrip(ctx context.Context, req []byte) (int, error) {
	for try := 0; ; try++ {
		fresh := w.conn == nil
		if fresh {
			if err := w.dial(ctx); err != nil {
				return 0, err
			}
		}
		dl, ok := ctx.Deadline()
		if !ok {
			dl = time.Now().Add(requestTimeout)
		}
		_ = w.conn.SetDeadline(dl)
		status, err := w.exchange(req)
		if err == nil {
			return status, nil
		}
		w.Close()
		if fresh || try > 0 || errors.Is(err, errAnswered) {
			return 0, &client.NetworkError{URL: "https://" + w.host, Err: err}
		}
	}
}

// errAnswered marks a failure after the answer started: the request was applied or may
// have been, so it is not repeated.
var errAnswered = errors.New("apibench: answer cut short")

func (w *wire) exchange(req []byte) (int, error) {
	if _, err := w.conn.Write(req); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(w.br, nil)
	if err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return 0, err // closed idle connection: nothing read
		}
		return 0, fmt.Errorf("%w: %v", errAnswered, err)
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxAnswer {
		return 0, fmt.Errorf("%w: %d-byte answer exceeds %d", errAnswered, resp.ContentLength, maxAnswer)
	}
	if resp.ContentLength >= 0 { // the controller's answers: one write with Content-Length
		if int64(cap(w.body)) < resp.ContentLength {
			w.body = make([]byte, resp.ContentLength)
		}
		w.body = w.body[:resp.ContentLength]
		if _, err := io.ReadFull(resp.Body, w.body); err != nil {
			return 0, fmt.Errorf("%w: %v", errAnswered, err)
		}
	} else {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
		if err != nil {
			return 0, fmt.Errorf("%w: %v", errAnswered, err)
		}
		if int64(len(b)) > maxAnswer {
			return 0, fmt.Errorf("%w: answer exceeds %d bytes", errAnswered, maxAnswer)
		}
		w.body = b
	}
	if resp.Close {
		w.Close()
	}
	return resp.StatusCode, nil
}

func (w *wire) dial(ctx context.Context) error {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: w.tlsCfg}
	c, err := d.DialContext(ctx, "tcp", w.addr)
	if err != nil {
		return &client.NetworkError{URL: "https://" + w.host, Err: err}
	}
	w.conn, w.br = c, bufio.NewReaderSize(c, 16<<10)
	return nil
}

// apiError is the controller's error answer in w.body as an *apiv1.Error.
func (w *wire) apiError(status int) error {
	var ae apiv1.Error
	if err := json.Unmarshal(w.body, &ae); err == nil && ae.Code != "" {
		return &ae
	}
	return &apiv1.Error{Code: client.CodeForStatus(status), Message: fmt.Sprintf("HTTP %d: %.200s", status, w.body)}
}
