// Package slowproxy is a TCP proxy that delays every byte from the client to the server by a
// fixed latency, so that each request to the server behind it (here, kube-apiserver over TLS and
// HTTP/2) is answered that much later, as a loaded API server would answer. Bytes keep their
// order and requests are not serialised: many requests in flight each see the same added
// latency, which is what distinguishes a slow server from a narrow one.
package slowproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections to a target with added latency.
type Proxy struct {
	target  string
	latency time.Duration
	l       net.Listener

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// Start listens on 127.0.0.1 and forwards every connection to target (host:port), delaying the
// client's bytes by latency. Addr tells where it listens.
func Start(target string, latency time.Duration) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("slowproxy: listening: %w", err)
	}
	p := &Proxy{target: target, latency: latency, l: l, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Close stops listening, closes every connection and waits for the copies to end.
func (p *Proxy) Close() {
	_ = p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) accept() {
	for {
		client, err := p.l.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.track(client, true)
		p.track(server, true)
		p.wg.Go(func() {
			var copies sync.WaitGroup
			copies.Go(func() { delayedCopy(server, client, p.latency) })
			copies.Go(func() { _, _ = io.Copy(client, server); closeWrite(client) })
			copies.Wait()
			_ = client.Close()
			_ = server.Close()
			p.track(client, false)
			p.track(server, false)
		})
	}
}

type chunk struct {
	at   time.Time
	data []byte
}

// delayedCopy copies src to dst, writing each chunk latency after it was read.
func delayedCopy(dst, src net.Conn, latency time.Duration) {
	chunks := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		timer := time.NewTimer(0)
		<-timer.C
		for c := range chunks {
			if wait := time.Until(c.at); wait > 0 {
				timer.Reset(wait)
				<-timer.C
			}
			if _, err := dst.Write(c.data); err != nil {
				// Drain, so the reader is not blocked on a full channel.
				for range chunks {
				}
				return
			}
		}
		closeWrite(dst)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunks <- chunk{at: time.Now().Add(latency), data: append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			}
			break
		}
	}
	close(chunks)
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}
