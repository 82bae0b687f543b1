package providers

import (
	"errors"
	"fmt"
	"io"
)

// MaxAnswer bounds what is read of one metadata answer: a real one is at most a few kilobytes
// (GCP's upcoming-maintenance directory, Azure's Scheduled Events document). A spoofed endpoint
// or a node-local proxy that streams for the poll's whole timeout must not fill the agent's
// memory.
const MaxAnswer = 1 << 20

// ErrTooLarge marks an answer longer than its limit.
var ErrTooLarge = errors.New("answer exceeds the size limit")

// LimitedBody reads at most limit bytes of a body; a byte more is ErrTooLarge, for this Read and
// every later one. The clients of the clouds' SDKs read a body whole before they return, so the
// bound goes under them, on the response's Body (AWS: a middleware; GCP: the transport).
type LimitedBody struct {
	rc    io.ReadCloser
	left  int64
	limit int64
	err   error
	// declared is the answer's Content-Length, -1 when it has none.
	declared int64
	// OnTooLarge, when set, is called once with the error.
	OnTooLarge func(error)
}

// NewLimitedBody bounds rc to limit bytes; length is the declared Content-Length (-1: none).
func NewLimitedBody(rc io.ReadCloser, length, limit int64) *LimitedBody {
	return &LimitedBody{rc: rc, left: limit, limit: limit, declared: length}
}

// fail records the body's error and returns it.
func (b *LimitedBody) fail() error {
	b.err = fmt.Errorf("%w of %d bytes (%d MiB)", ErrTooLarge, b.limit, b.limit>>20)
	if b.OnTooLarge != nil {
		b.OnTooLarge(b.err)
		b.OnTooLarge = nil
	}
	return b.err
}

// Read implements io.Reader.
func (b *LimitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.declared > b.limit {
		return 0, b.fail() // too long by its own account: not read at all
	}
	if len(p) == 0 {
		return 0, nil
	}
	if b.left == 0 {
		// At the limit: the answer is too long if anything follows.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			return 0, b.fail()
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

// Close implements io.Closer.
func (b *LimitedBody) Close() error { return b.rc.Close() }
