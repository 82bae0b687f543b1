package aws

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
)

// TestHibernateDeadlineIsNow: AWS gives no two-minute warning for hibernation ("the
// hibernation process begins immediately"). The deadline is min(time, first seen), it stays
// put from poll to poll, and the action says why the pods go at once.
func TestHibernateDeadlineIsNow(t *testing.T) {
	e := newPollEnv(t)
	docTime := t0.Add(2 * time.Minute)
	e.imds.set(PathSpotInstanceAction, http.StatusOK, `{"action": "hibernate", "time": "`+docTime.Format(time.RFC3339)+`"}`)
	ns, err := e.poll(t)
	checkErr(t, err, "")
	if len(ns) != 1 {
		t.Fatalf("got %q, want the hibernation", summaries(ns))
	}
	n := ns[0]
	if !n.Deadline.Equal(t0) || !n.NoticeTime.Equal(t0) {
		t.Errorf("deadline %s (noticed %s), want %s: hibernation begins immediately", rfc3339(n.Deadline), rfc3339(n.NoticeTime), rfc3339(t0))
	}
	if !n.Interrupts() || !strings.Contains(n.Action, "no two-minute warning") {
		t.Errorf("notice %s: want an interruption whose action says there is no warning", summary(n))
	}
	e.clk.Step(10 * time.Second)
	again, err := e.poll(t)
	checkErr(t, err, "")
	if len(again) != 1 || !again[0].Deadline.Equal(t0) || again[0].ID != n.ID {
		t.Errorf("second poll: got %q, want the same deadline and ID", summaries(again))
	}

	// A document time already past stays the deadline: min(time, first seen).
	e2 := newPollEnv(t)
	past := t0.Add(-5 * time.Second)
	e2.imds.set(PathSpotInstanceAction, http.StatusOK, `{"action": "hibernate", "time": "`+past.Format(time.RFC3339)+`"}`)
	if ns, err := e2.poll(t); err != nil || len(ns) != 1 || !ns[0].Deadline.Equal(past) {
		t.Errorf("past time: got %q, %v; want deadline %s", summaries(ns), err, rfc3339(past))
	}
	// terminate and stop keep their two minutes.
	e3 := newPollEnv(t)
	e3.imds.set(PathSpotInstanceAction, http.StatusOK, `{"action": "stop", "time": "`+docTime.Format(time.RFC3339)+`"}`)
	if ns, err := e3.poll(t); err != nil || len(ns) != 1 || !ns[0].Deadline.Equal(docTime) {
		t.Errorf("stop: got %q, %v; want deadline %s", summaries(ns), err, rfc3339(docTime))
	}
}

// blackHole accepts connections and never answers nor closes them, as a token PUT whose
// answer the IMDS hop limit drops looks to the client.
func blackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed at the test's end: release the held connections
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return "http://" + ln.Addr().String()
}

// TestCustomClientBlackHoledTokenFailsFast: main passes its own (instrumented) HTTP client,
// which has none of the SDK client's short timeouts. A token PUT into a black hole must still
// fail within a second, not after the SDK's 5 s per call.
func TestCustomClientBlackHoledTokenFailsFast(t *testing.T) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	p, err := New(Options{Endpoint: blackHole(t), HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.Poll(context.Background())
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("Poll against a black hole: no error")
	}
	if elapsed > time.Second {
		t.Errorf("Poll took %v against a black-holed token PUT, want under 1 s", elapsed)
	}
	if !errors.Is(err, ErrNoResponse) {
		t.Errorf("error %v: want it to wrap ErrNoResponse", err)
	}
	if !strings.Contains(err.Error(), "within 500ms") {
		t.Errorf("error %v does not say the bound", err)
	}
	t.Logf("failed after %v: %v", elapsed, err)
}

// TestCustomClientSlowBodyIsNotCut: the bound is on the headers only; a body that takes
// longer than it, once the headers came, is read in full. The bound's timer runs on a fake
// clock: the spot path's answer sends its headers, waits until the other paths are answered
// and no bound's timer is left (each stopped at its headers), then the clock passes the bound
// twice over before the body is sent.
func TestCustomClientSlowBodyIsNotCut(t *testing.T) {
	f := newFakeIMDS(t, nil)
	f.setFile(PathSpotInstanceAction, "spot_terminate.json")
	timers := clocktesting.NewFakeClock(t0)
	var others atomic.Int32
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, PathSpotInstanceAction) {
			f.serve(w, r)
			if r.Method == http.MethodGet {
				others.Add(1)
			}
			return
		}
		f.serve(&slowWriter{ResponseWriter: w, pause: func() {
			if err := wait.PollUntilContextTimeout(r.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				return others.Load() == int32(len(sources)-1) && !timers.HasWaiters(), nil
			}); err != nil {
				t.Errorf("the other paths' answers or their timers' end never came: %v", err)
			}
			timers.Step(2 * DefaultResponseHeaderTimeout)
		}}, r)
	})
	f.srv.Config.Handler = slow
	p, err := New(Options{Endpoint: f.URL(), HTTPClient: &http.Client{}, Timers: timers})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := p.Poll(context.Background())
	checkErr(t, err, "")
	if len(ns) != 1 || ns[0].Kind != providers.KindSpotInterruption {
		t.Errorf("got %q, want the spot notice", summaries(ns))
	}
}

// slowWriter sends the headers at once, then calls pause before the body.
type slowWriter struct {
	http.ResponseWriter
	pause func()
	wrote bool
}

func (w *slowWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.wrote = true
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		w.pause()
	}
	return w.ResponseWriter.Write(b)
}
