package events

import (
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// Delivery counts the events recorded and the writes the sink finished, so that a stopping agent
// can wait, within a bound, for the events it queued last (the window's summary, the missed
// deadlines) to reach the API server: client-go's broadcaster has no flush, and its Shutdown drops
// what is still queued (kubernetes/kubernetes#27858). A write the correlator drops as spam is
// never delivered; the wait's bound covers it.
type Delivery struct {
	recorded, written, inFlight atomic.Int64
	// last is when an event was last recorded or a write last started or ended (Unix ns).
	last atomic.Int64
}

func (d *Delivery) touch() { d.last.Store(time.Now().UnixNano()) }

// Recorder returns r counting each event it records.
func (d *Delivery) Recorder(r record.EventRecorder) record.EventRecorder {
	return &countingRecorder{r: r, d: d}
}

// Sink returns s counting each write it finishes, succeeded or not.
func (d *Delivery) Sink(s record.EventSink) record.EventSink { return &countingSink{s: s, d: d} }

// deliveryQuiet is how long the broadcaster must have been idle (nothing recorded, no write in
// flight) for what is left to count as dropped by its spam filter rather than still queued: it
// hands an event to the sink within microseconds when the sink is free.
const deliveryQuiet = 200 * time.Millisecond

// Wait returns once the sink has finished as many writes as events were recorded, or has been
// idle for deliveryQuiet with nothing in flight (the rest was aggregated or filtered as spam), or
// after timeout; it reports whether it returned before the timeout.
func (d *Delivery) Wait(timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for d.written.Load() < d.recorded.Load() {
		if d.inFlight.Load() == 0 && time.Since(time.Unix(0, d.last.Load())) > deliveryQuiet {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

type countingRecorder struct {
	r record.EventRecorder
	d *Delivery
}

func (c *countingRecorder) Event(object runtime.Object, eventtype, reason, message string) {
	c.d.touch()
	c.d.recorded.Add(1)
	c.r.Event(object, eventtype, reason, message)
}

func (c *countingRecorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	c.d.touch()
	c.d.recorded.Add(1)
	c.r.Eventf(object, eventtype, reason, messageFmt, args...)
}

func (c *countingRecorder) AnnotatedEventf(object runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	c.d.touch()
	c.d.recorded.Add(1)
	c.r.AnnotatedEventf(object, annotations, eventtype, reason, messageFmt, args...)
}

type countingSink struct {
	s record.EventSink
	d *Delivery
}

func (c *countingSink) Create(e *v1.Event) (*v1.Event, error) {
	defer c.d.done(c.d.start())
	return c.s.Create(e)
}

func (c *countingSink) Update(e *v1.Event) (*v1.Event, error) {
	defer c.d.done(c.d.start())
	return c.s.Update(e)
}

func (c *countingSink) Patch(old *v1.Event, data []byte) (*v1.Event, error) {
	defer c.d.done(c.d.start())
	return c.s.Patch(old, data)
}

// start records a write beginning; done its end.
func (d *Delivery) start() struct{} {
	d.inFlight.Add(1)
	d.touch()
	return struct{}{}
}

func (d *Delivery) done(struct{}) {
	d.written.Add(1)
	d.inFlight.Add(-1)
	d.touch()
}
