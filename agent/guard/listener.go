package guard

import (
	"net"
	"sync"
)

// connLimitListener closes, as soon as it is accepted, a connection past perSource open
// connections from its source (SourceKey) or past max in all. Closing costs no TLS handshake and
// does not block Accept, so the connections of other sources keep being accepted: unlike
// netutil.LimitListener, which stops accepting at its cap and so queues every source behind it.
type connLimitListener struct {
	net.Listener
	max, perSource int
	// refused is called for each connection closed at once (a metric); it may be nil.
	refused func()

	mu       sync.Mutex
	open     int
	bySource map[string]int
}

func newConnLimitListener(ln net.Listener, max, perSource int, refused func()) *connLimitListener {
	return &connLimitListener{Listener: ln, max: max, perSource: perSource, refused: refused, bySource: map[string]int{}}
}

// Accept returns the next connection within the caps.
func (l *connLimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := SourceKey(c.RemoteAddr().String())
		if l.take(key) {
			return &limitedConn{Conn: c, release: func() { l.give(key) }}, nil
		}
		_ = c.Close()
		if l.refused != nil {
			l.refused()
		}
	}
}

func (l *connLimitListener) take(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.max || l.bySource[key] >= l.perSource {
		return false
	}
	l.open++
	l.bySource[key]++
	return true
}

func (l *connLimitListener) give(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.bySource[key]--; l.bySource[key] <= 0 {
		delete(l.bySource, key)
	}
}

// limitedConn gives its slot back on its first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
