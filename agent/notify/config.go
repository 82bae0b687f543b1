package notify

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"text/template"
	"time"
)

// Defaults for the fields of Config; DefaultConfig returns them. Flags should use them as their
// defaults, so that an explicit zero reaches Validate and is reported rather than replaced.
const (
	DefaultTimeout     = 5 * time.Second
	DefaultMaxAttempts = 4
	DefaultQueueSize   = 64
)

// DefaultTemplate renders a body that Slack's incoming webhooks (and most chat webhooks that
// take {"text": ...}) accept.
const DefaultTemplate = `{"text": {{json .Text}}}`

// Config configures webhook notifications.
type Config struct {
	// URL is the http or https endpoint the messages are POSTed to. It often holds a secret
	// (Slack puts its token in the path), so it is never logged or put in an error.
	URL string
	// Template is a text/template for the request body, executed with a Message. Empty means
	// DefaultTemplate. The func json encodes any value as JSON, quotes and escapes included.
	Template string
	// Headers are added to every request, for example Authorization. A Content-Type here
	// replaces the default application/json.
	Headers map[string]string
	// Timeout bounds one attempt.
	Timeout time.Duration
	// MaxAttempts bounds the attempts per message, the first included.
	MaxAttempts int
	// QueueSize is how many messages may wait; Notify drops messages beyond it.
	QueueSize int
	// AllowHTTP accepts an http:// URL. Without it only https:// is: the message and the
	// headers (often an API key) would cross the network in the clear.
	AllowHTTP bool
}

// DefaultConfig returns a Config with every default filled in and no URL.
func DefaultConfig() Config {
	return Config{Timeout: DefaultTimeout, MaxAttempts: DefaultMaxAttempts, QueueSize: DefaultQueueSize}
}

// Validate reports every problem with the configuration at once. Zero values are problems too:
// start from DefaultConfig.
func (c Config) Validate() error {
	var errs []error
	if err := validateURL(c.URL, c.AllowHTTP); err != nil {
		errs = append(errs, err)
	}
	if _, err := parseTemplate(c.Template); err != nil {
		errs = append(errs, err)
	}
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(c.Headers)) {
		if err := validateHeader(name, c.Headers[name]); err != nil {
			errs = append(errs, fmt.Errorf("webhook header %q: %w", name, err))
		}
		key := textproto.CanonicalMIMEHeaderKey(name)
		if other, dup := seen[key]; dup {
			errs = append(errs, fmt.Errorf("webhook headers %q and %q: the same header twice", other, name))
		}
		seen[key] = name
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("webhook timeout %s: must be positive", c.Timeout))
	}
	if c.MaxAttempts <= 0 {
		errs = append(errs, fmt.Errorf("webhook max attempts %d: must be positive", c.MaxAttempts))
	}
	if c.QueueSize <= 0 {
		errs = append(errs, fmt.Errorf("webhook queue size %d: must be positive", c.QueueSize))
	}
	return errors.Join(errs...)
}

func validateURL(raw string, allowHTTP bool) error {
	if raw == "" {
		return errors.New("webhook url is empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the whole URL in its error; keep only the reason, the URL may hold a token.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("webhook url does not parse: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("webhook url scheme %q: must be http or https", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("webhook url has no host")
	}
	if u.Scheme == "http" && !allowHTTP {
		return errors.New("webhook url scheme \"http\": the message and its headers would cross the network in the clear; use https, or allow plain HTTP explicitly (--webhook-allow-http)")
	}
	return nil
}

// parseTemplate parses the body template (empty: DefaultTemplate) and executes it once on a
// sample Message, so that a misspelt field fails at startup rather than on the first notice.
func parseTemplate(text string) (*template.Template, error) {
	if text == "" {
		text = DefaultTemplate
	}
	tmpl, err := template.New("webhook").Funcs(template.FuncMap{"json": jsonString}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("webhook template does not parse: %w", err)
	}
	sample := Message{Kind: KindNotice, Node: "node", Provider: "aws", NoticeKind: "spot-interruption", NoticeID: "id",
		Action: "terminate", Deadline: time.Unix(120, 0), NoticeTime: time.Unix(0, 0), Pods: 2, PodsInTime: 1, PodsMissed: 1, Text: "text"}
	if err := tmpl.Execute(io.Discard, sample); err != nil {
		return nil, fmt.Errorf("webhook template fails on a sample message: %w", err)
	}
	return tmpl, nil
}

// ParseHeaders parses repeated --webhook-header flags, each "Name: value". Errors name the entry
// by position and header name, never by value: values are usually credentials.
func ParseHeaders(flags []string) (map[string]string, error) {
	headers := make(map[string]string, len(flags))
	var errs []error
	for i, f := range flags {
		name, value, ok := strings.Cut(f, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok {
			// Without a colon there is no name to show, and the entry may be a bare token.
			errs = append(errs, fmt.Errorf("--webhook-header #%d: no colon; want 'Name: value'", i+1))
			continue
		}
		if err := validateHeader(name, value); err != nil {
			errs = append(errs, fmt.Errorf("--webhook-header #%d (%q): %w", i+1, name, err))
			continue
		}
		key := textproto.CanonicalMIMEHeaderKey(name)
		if _, dup := headers[key]; dup {
			errs = append(errs, fmt.Errorf("--webhook-header #%d (%q): header given more than once", i+1, name))
			continue
		}
		headers[key] = value
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return headers, nil
}

func validateHeader(name, value string) error {
	if name == "" {
		return errors.New("empty header name")
	}
	for _, r := range name {
		if !isTokenChar(r) {
			return fmt.Errorf("header name has invalid character %q", r)
		}
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return errors.New("header value contains a line break or NUL")
	}
	return nil
}

// isTokenChar reports whether r may appear in a header name (RFC 9110 section 5.6.2 tchar).
func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}
