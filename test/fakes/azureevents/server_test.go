package azureevents

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	eventsURL  = ScheduledEventsPath + "?api-version=2020-07-01"
	computeURL = ComputePath + "?api-version=2021-02-01"
)

// call sends one request to s and returns the status and body.
func call(t *testing.T, s *Server, method, target, body string, header map[string]string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, target, rd)
	r.Header.Set("Metadata", "true")
	for k, v := range header {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

// document fetches and decodes the events document generically, to check the wire shape.
func document(t *testing.T, s *Server) map[string]any {
	t.Helper()
	code, body := call(t, s, http.MethodGet, eventsURL, "", nil)
	if code != http.StatusOK {
		t.Fatalf("GET events: %d %s", code, body)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	return doc
}

func TestRequestsAreChecked(t *testing.T) {
	s := New("vmss_3")
	tests := []struct {
		name    string
		method  string
		target  string
		header  map[string]string
		want    int
		wantErr string
	}{
		{name: "events", method: http.MethodGet, target: eventsURL, want: 200},
		{name: "compute", method: http.MethodGet, target: computeURL, want: 200},
		{name: "no Metadata header", method: http.MethodGet, target: eventsURL, header: map[string]string{"Metadata": ""},
			want: 400, wantErr: "Required metadata header not specified"},
		{name: "Metadata: True", method: http.MethodGet, target: eventsURL, header: map[string]string{"Metadata": "True"}, want: 400},
		{name: "no Metadata header on compute", method: http.MethodGet, target: computeURL, header: map[string]string{"Metadata": ""}, want: 400},
		{name: "no Metadata header on approval", method: http.MethodPost, target: eventsURL, header: map[string]string{"Metadata": ""}, want: 400},
		{name: "X-Forwarded-For", method: http.MethodGet, target: eventsURL, header: map[string]string{"X-Forwarded-For": "10.0.0.1"}, want: 400},
		{name: "no api-version", method: http.MethodGet, target: ScheduledEventsPath, want: 400, wantErr: `"newest-versions":["2020-07-01","2019-08-01","2019-04-01"]`},
		{name: "unknown api-version", method: http.MethodGet, target: ScheduledEventsPath + "?api-version=latest", want: 400, wantErr: "api-version is invalid"},
		{name: "an instance version on events", method: http.MethodGet, target: ScheduledEventsPath + "?api-version=2021-02-01", want: 400},
		{name: "duplicate api-version", method: http.MethodGet, target: eventsURL + "&api-version=2020-07-01", want: 400, wantErr: "Duplicate"},
		{name: "unknown path", method: http.MethodGet, target: "/metadata/instance?api-version=2021-02-01", want: 404},
		{name: "PUT", method: http.MethodPut, target: eventsURL, want: 405},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := call(t, s, tc.method, tc.target, "", tc.header)
			if code != tc.want || !strings.Contains(body, tc.wantErr) {
				t.Errorf("got %d %s, want %d with %q", code, body, tc.want, tc.wantErr)
			}
			if code == 400 && !json.Valid([]byte(body)) {
				t.Errorf("400 body %q is not JSON", body)
			}
		})
	}
	c := s.Counts()
	if c.BadRequests != 9 || c.MissingMeta != 4 || c.EventsGets != 8 || c.ComputeGets != 2 || c.EventsPosts != 1 || c.Other != 2 {
		t.Errorf("counts %+v", c)
	}
}

func TestDocument(t *testing.T) {
	s := New("vmss_3")
	doc := document(t, s)
	if doc["DocumentIncarnation"] != 1.0 || len(doc["Events"].([]any)) != 0 {
		t.Errorf("empty document %v", doc)
	}
	nb := time.Date(2026, 11, 29, 10, 15, 0, 0, time.FixedZone("CET", 3600))
	id := s.AddEvent(Event{EventType: EventTypeReboot, Resources: []string{"vmss_3"}, NotBefore: nb, DurationInSeconds: -1,
		Description: "Host server is undergoing maintenance."})
	if len(id) != 36 || strings.ToUpper(id) != id {
		t.Errorf("generated EventId %q: want an upper-case GUID", id)
	}
	doc = document(t, s)
	ev := doc["Events"].([]any)[0].(map[string]any)
	want := map[string]any{
		"EventId": id, "EventStatus": "Scheduled", "EventType": "Reboot", "ResourceType": "VirtualMachine",
		"Resources": []any{"vmss_3"}, "NotBefore": "Sun, 29 Nov 2026 09:15:00 GMT",
		"Description": "Host server is undergoing maintenance.", "EventSource": "Platform", "DurationInSeconds": -1.0,
	}
	if doc["DocumentIncarnation"] != 2.0 || !equalJSON(ev, want) {
		t.Errorf("got %v (incarnation %v)\nwant %v", ev, doc["DocumentIncarnation"], want)
	}

	// Each change bumps the incarnation once; a no-op or an unknown ID does not.
	steps := []struct {
		name string
		do   func() bool
		inc  int
	}{
		{"SetStatus Started", func() bool { return s.SetStatus(id, StatusStarted) }, 3},
		{"SetStatus Started again", func() bool { return s.SetStatus(id, StatusStarted) }, 3},
		{"SetStatus unknown", func() bool { return !s.SetStatus("nope", StatusStarted) }, 3},
		{"AddEvent replacing", func() bool { return s.AddEvent(Event{EventID: id, EventType: EventTypeRedeploy}) == id }, 4},
		{"RemoveEvent", func() bool { return s.RemoveEvent(id) }, 5},
		{"RemoveEvent again", func() bool { return !s.RemoveEvent(id) }, 5},
	}
	for _, st := range steps {
		if !st.do() {
			t.Errorf("%s: unexpected result", st.name)
		}
		if got := s.DocumentIncarnation(); got != st.inc {
			t.Errorf("%s: incarnation %d, want %d", st.name, got, st.inc)
		}
	}

	// NotBefore is blank once Started, as Azure serves it.
	id = s.AddEvent(Event{EventType: EventTypeFreeze, EventStatus: StatusStarted, NotBefore: nb})
	for _, e := range document(t, s)["Events"].([]any) {
		if e := e.(map[string]any); e["EventId"] == id && (e["NotBefore"] != "" || !equalJSON(e["Resources"], []any{})) {
			t.Errorf("started event %v: want NotBefore \"\" and Resources []", e)
		}
	}
	if evs := s.Events(); len(evs) != 1 || evs[0].EventID != id {
		t.Errorf("Events() = %+v", evs)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestApprovals(t *testing.T) {
	s := New("vmss_3")
	a := s.AddEvent(Event{EventType: EventTypePreempt, Resources: []string{"vmss_3"}, NotBefore: time.Now().Add(30 * time.Second)})
	b := s.AddEvent(Event{EventType: EventTypeFreeze, Resources: []string{"vmss_3", "vmss_4"}, NotBefore: time.Now().Add(15 * time.Minute)})
	inc := s.DocumentIncarnation()
	post := func(body string) int {
		code, _ := call(t, s, http.MethodPost, eventsURL, body, nil)
		return code
	}
	for _, body := range []string{
		`not json`,
		`{"StartRequests": []}`,
		`{}`,
		`{"StartRequests": [{"EventId": "unknown"}]}`,
		`{"StartRequests": [{"EventId": "` + a + `"}, {"EventId": "unknown"}]}`,
		`{"StartRequests": [{}]}`,
	} {
		if code := post(body); code != http.StatusBadRequest {
			t.Errorf("POST %s: %d, want 400", body, code)
		}
	}
	if got := s.Approvals(); len(got) != 0 || s.DocumentIncarnation() != inc {
		t.Fatalf("refused approvals changed the fake: approvals %q, incarnation %d", got, s.DocumentIncarnation())
	}

	if code := post(`{"StartRequests": [{"EventId": "` + a + `"}]}`); code != http.StatusOK {
		t.Fatalf("approval: %d", code)
	}
	if s.DocumentIncarnation() != inc+1 || s.Events()[0].EventStatus != StatusStarted || s.Events()[1].EventStatus != "" {
		t.Errorf("after approval: incarnation %d, events %+v", s.DocumentIncarnation(), s.Events())
	}
	// Approving again (another VM of the set did) is a success and changes nothing.
	if code := post(`{"StartRequests": [{"EventId": "` + a + `"}]}`); code != http.StatusOK || s.DocumentIncarnation() != inc+1 {
		t.Errorf("second approval: %d, incarnation %d", code, s.DocumentIncarnation())
	}
	// Several in one request, form-encoded as curl -d sends it: the content type does not matter.
	code, _ := call(t, s, http.MethodPost, eventsURL, `{"StartRequests": [{"EventId": "`+b+`"}, {"EventId": "`+a+`"}]}`,
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if code != http.StatusOK || s.DocumentIncarnation() != inc+2 {
		t.Errorf("approval of two: %d, incarnation %d", code, s.DocumentIncarnation())
	}
	if got, want := s.Approvals(), []string{a, a, b, a}; !slices.Equal(got, want) {
		t.Errorf("Approvals() = %q, want %q", got, want)
	}
	if c := s.Counts(); c.Approvals != 3 || c.EventsPosts != 9 || c.BadRequests != 6 {
		t.Errorf("counts %+v", c)
	}
}

func TestThrottle(t *testing.T) {
	s := New("vmss_3")
	s.Throttle(2)
	var codes []int
	for _, target := range []string{eventsURL, computeURL, eventsURL} {
		code, _ := call(t, s, http.MethodGet, target, "", nil)
		codes = append(codes, code)
	}
	if !slices.Equal(codes, []int{429, 429, 200}) {
		t.Errorf("codes %v, want 429 429 200", codes)
	}
	// Throttling comes before the header check, as a rate limit would.
	s.Throttle(1)
	if code, _ := call(t, s, http.MethodGet, eventsURL, "", map[string]string{"Metadata": ""}); code != 429 {
		t.Errorf("throttled request without header: %d", code)
	}
	if c := s.Counts(); c.Throttled != 3 || c.EventsGets != 3 || c.ComputeGets != 1 {
		t.Errorf("counts %+v", c)
	}
}

func TestCompute(t *testing.T) {
	s := New("aks-nodepool1-38290525-vmss_3")
	check := func(want map[string]string) {
		t.Helper()
		code, body := call(t, s, http.MethodGet, computeURL, "", nil)
		var got map[string]any
		if code != 200 || json.Unmarshal([]byte(body), &got) != nil {
			t.Fatalf("GET compute: %d %s", code, body)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %#v, want %q (every primitive a string)", k, got[k], v)
			}
		}
	}
	check(map[string]string{"name": "aks-nodepool1-38290525-vmss_3", "vmScaleSetName": "", "priority": ""})
	s.SetCompute(Compute{Name: "aks-nodepool1-38290525-vmss_3", VMScaleSetName: "aks-nodepool1-38290525-vmss", Priority: "Spot", EvictionPolicy: "Delete"})
	check(map[string]string{"name": "aks-nodepool1-38290525-vmss_3", "vmScaleSetName": "aks-nodepool1-38290525-vmss",
		"priority": "Spot", "evictionPolicy": "Delete"})
}

func TestStart(t *testing.T) {
	s := New("vm")
	if _, err := s.Start("0.0.0.0:0"); err == nil || !strings.Contains(err.Error(), "not loopback") {
		t.Errorf("Start on all interfaces: %v", err)
	}
	if _, err := s.Start("example.com:80"); err == nil {
		t.Error("Start on a host name succeeded")
	}
	url, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Errorf("URL %q", url)
	}
	if _, err := s.Start("127.0.0.1:0"); err == nil {
		t.Error("second Start succeeded")
	}
	req, _ := http.NewRequest(http.MethodGet, url+eventsURL, nil)
	req.Header.Set("Metadata", "true")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("over the network: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	s.Close()
	s.Close()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Error("a request succeeded after Close")
	}
}

func TestFirstAnswerDelay(t *testing.T) {
	s := New("vmss_3")
	const delay = 300 * time.Millisecond
	s.SetFirstAnswerDelay(delay)
	type answer struct {
		code int
		body string
		at   time.Time
	}
	start := time.Now()
	first := make(chan answer, 1)
	go func() {
		code, body := call(t, s, http.MethodGet, eventsURL, "", nil)
		first <- answer{code, body, time.Now()}
	}()
	// An event posted while the first call is held is in its answer.
	id := s.AddEvent(Event{EventType: EventTypePreempt, Resources: []string{"vmss_3"}, NotBefore: start.Add(30 * time.Second)})
	a := <-first
	if at := s.FirstAnswerAt(); at.Before(start.Add(delay-20*time.Millisecond)) || at.After(a.at) {
		t.Errorf("FirstAnswerAt %v, want about %v after the first request (answered %v)", at.Sub(start), delay, a.at.Sub(start))
	}
	if took := a.at.Sub(start); a.code != http.StatusOK || took < delay-20*time.Millisecond {
		t.Errorf("first answer %d after %v, want 200 after about %v", a.code, took, delay)
	}
	if !strings.Contains(a.body, id) {
		t.Errorf("first answer %s lacks the event posted meanwhile", a.body)
	}
	// Later calls are answered at once.
	before := time.Now()
	if code, _ := call(t, s, http.MethodGet, eventsURL, "", nil); code != http.StatusOK || time.Since(before) > delay/2 {
		t.Errorf("second call: %d after %v, want at once", code, time.Since(before))
	}
}

func TestApprovalStartDelay(t *testing.T) {
	s := New("vmss_3")
	t.Cleanup(s.Close)
	s.SetApprovalStartDelay(200 * time.Millisecond)
	id := s.AddEvent(Event{EventType: EventTypeReboot, Resources: []string{"vmss_3"}, NotBefore: time.Now().Add(15 * time.Minute)})
	if code, body := call(t, s, http.MethodPost, eventsURL, `{"StartRequests":[{"EventId":"`+id+`"}]}`, nil); code != http.StatusOK {
		t.Fatalf("approval: %d %s", code, body)
	}
	if st := s.Events()[0].EventStatus; st == StatusStarted {
		t.Errorf("status %q right after the approval, want it to start later", st)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Events()[0].EventStatus != StatusStarted {
		if time.Now().After(deadline) {
			t.Fatal("the approved event never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.Approvals(); !slices.Equal(got, []string{id}) {
		t.Errorf("approvals %v, want [%s]", got, id)
	}
}

// TestFirstAnswerAbandoned: a first call given up before its answer enables nothing; the next
// one waits the whole delay again.
func TestFirstAnswerAbandoned(t *testing.T) {
	s := New("vmss_3")
	const delay = 400 * time.Millisecond
	s.SetFirstAnswerDelay(delay)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	r := httptest.NewRequest(http.MethodGet, eventsURL, nil).WithContext(ctx)
	r.Header.Set("Metadata", "true")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	cancel()
	if !s.FirstAnswerAt().IsZero() {
		t.Errorf("FirstAnswerAt %v after an abandoned first call, want it reset", s.FirstAnswerAt())
	}
	start := time.Now()
	if code, _ := call(t, s, http.MethodGet, eventsURL, "", nil); code != http.StatusOK {
		t.Fatalf("second call: %d", code)
	}
	if took := time.Since(start); took < delay-20*time.Millisecond {
		t.Errorf("second call answered after %v, want the whole delay %v again", took, delay)
	}
}
