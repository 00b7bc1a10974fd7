package webhook

import (
	"errors"
	"net/url"
	"strings"
)

// parseURL checks a webhook URL's shape.
func parseURL(raw string) (*url.URL, error) {
	if strings.ContainsAny(raw, " \t\r\n") {
		return nil, errors.New("url must not contain spaces")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("url is not a valid URL")
	}
	switch {
	case u.Scheme != "https":
		return nil, errors.New("url must be https:// (deliveries are signed, and sent only over TLS)")
	case u.Hostname() == "":
		return nil, errors.New("url needs a host")
	case u.User != nil:
		return nil, errors.New("url must not hold credentials (deliveries are authenticated by their signature)")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, errors.New("url must not have a fragment")
	}
	return u, nil
}
