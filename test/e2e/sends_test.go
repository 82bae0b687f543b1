package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// What the agent logged as it sent each eviction: the bounds of the timing tests come from the
// figures a run observes, not from constants tuned on a quiet machine (issue 52). The agent
// logs every eviction as it leaves ("Evicting pod", evict.go's send), with the plan and the
// queueing margin it measured then: a pod whose plan the window set leaves EvictionLead plus
// that margin before its plan, and on a loaded machine the margin is half a second or more, a
// figure of the run that a fixed slack ignored (TestLifecycleUpgradeMidWindowKeepsCountdowns saw
// a 5 s pod sent 1.03 s before its plan, after an answer of 529 ms).

// agentSend is one eviction request as the agent logged it when it sent it.
type agentSend struct {
	At         time.Time // the log line's time: when the request left
	Pod        string    // namespace/name
	Planned    time.Time
	ByDeadline bool
	// Margin is the queueing margin the agent measured, which a deadline-bound send leaves
	// before its plan on top of plan.EvictionLead.
	Margin  time.Duration
	Attempt int
}

// klogLine is a text klog line: its header's time, then the message and its key/value pairs.
var klogLine = regexp.MustCompile(`^I(\d{4} \d{2}:\d{2}:\d{2}\.\d{6})\s+\d+ \S+\] "(?:Evicting pod|` + forceMsg + `)" (.*)$`)

// forceMsg is the agent's line as it sends a forced delete (evict.go's sendForce): a send too,
// with the queueing margin its grace was cut by.
const forceMsg = "Deleting pod: the reclaim deadline leaves no time for a blocked eviction"

// klogValue is one key="value" or key=value pair of a text klog line.
var klogValue = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)

// agentSends reads every "Evicting pod" line of an agent's log, and every forced delete's
// (forceMsg), in text (klog) or JSON format.
func agentSends(path string) ([]agentSend, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the agent's log: %w", err)
	}
	defer f.Close()
	var out []agentSend
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	year := time.Now().Year()
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `Evicting pod"`) && !strings.Contains(line, forceMsg+`"`) {
			continue
		}
		var s agentSend
		var err error
		if strings.HasPrefix(line, "{") {
			s, err = jsonSend(line)
		} else {
			s, err = textSend(line, year)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the agent's log %s: %w in %q", path, err, line)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the agent's log %s: %w", path, err)
	}
	return out, nil
}

// textSend parses a text line: klog's header has no year and is in local time (the agent is
// a process of this machine).
func textSend(line string, year int) (agentSend, error) {
	m := klogLine.FindStringSubmatch(line)
	if m == nil {
		return agentSend{}, fmt.Errorf("not a klog line")
	}
	at, err := time.ParseInLocation("2006 0102 15:04:05.000000", strconv.Itoa(year)+" "+m[1], time.Local)
	if err != nil {
		return agentSend{}, err
	}
	s := agentSend{At: at}
	for _, kv := range klogValue.FindAllStringSubmatch(m[2], -1) {
		v := kv[2]
		if strings.HasPrefix(v, `"`) {
			if v, err = strconv.Unquote(v); err != nil {
				return agentSend{}, err
			}
		}
		switch kv[1] {
		case "pod":
			s.Pod = v
		case "planned":
			// time.Time's String: "2006-01-02 15:04:05.999999999 -0700 MST".
			if s.Planned, err = time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", v); err != nil {
				return agentSend{}, err
			}
		case "byDeadline":
			s.ByDeadline = v == "true"
		case "queueMargin":
			if s.Margin, err = time.ParseDuration(v); err != nil {
				return agentSend{}, err
			}
		case "attempt":
			if s.Attempt, err = strconv.Atoi(v); err != nil {
				return agentSend{}, err
			}
		}
	}
	return s, nil
}

// jsonSend parses a JSON line (--log-format=json: durations in nanoseconds).
func jsonSend(line string) (agentSend, error) {
	var j struct {
		Time time.Time `json:"time"`
		Pod  struct {
			Name, Namespace string
		} `json:"pod"`
		Planned     time.Time     `json:"planned"`
		ByDeadline  bool          `json:"byDeadline"`
		QueueMargin time.Duration `json:"queueMargin"`
		Attempt     int           `json:"attempt"`
	}
	if err := json.Unmarshal([]byte(line), &j); err != nil {
		return agentSend{}, err
	}
	return agentSend{At: j.Time, Pod: j.Pod.Namespace + "/" + j.Pod.Name, Planned: j.Planned, ByDeadline: j.ByDeadline,
		Margin: j.QueueMargin, Attempt: j.Attempt}, nil
}

// TestAgentSendsParsed reads both log formats as the agent writes them (lines of a run of
// TestLifecycleUpgradeMidWindowKeepsCountdowns), so that a bound never rests on a figure
// misread.
func TestAgentSendsParsed(t *testing.T) {
	t.Parallel()
	const text = `I1205 10:49:15.971103   13412 evict.go:315] "Evicting pod" pod="lc-up/latest" grace="5s" podGrace="5s" planned="2026-12-05 10:49:17 +0000 UTC" due="2026-12-05 10:58:57 +0000 UTC" latest="2026-12-05 10:49:17 +0000 UTC" byDeadline=true queueMargin="529.707194ms" attempt=1
I1205 10:49:15.972000   13412 evict.go:320] "Eviction blocked by a PodDisruptionBudget; retrying" pod="lc-up/other" attempt=1
I1205 12:57:01.054399    2667 evict.go:391] "Deleting pod: the reclaim deadline leaves no time for a blocked eviction" pod="spot/pdb-blocked" grace="4s" attempts=9 queueMargin="3.388932672s"
{"time":"2026-12-05T10:49:17.19612116Z","level":"INFO","msg":"Evicting pod","pod":{"name":"latest","namespace":"lc-up-v2"},"grace":5000000000,"podGrace":5000000000,"planned":"2026-12-05T10:49:18Z","due":"2026-12-05T10:58:58Z","latest":"2026-12-05T10:49:18Z","byDeadline":true,"queueMargin":305005139,"attempt":2}
`
	path := t.TempDir() + "/reprieve.log"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	sends, err := agentSends(path)
	if err != nil {
		t.Fatal(err)
	}
	year := time.Now().Year()
	want := []agentSend{
		{At: time.Date(year, 12, 5, 10, 49, 15, 971103000, time.Local), Pod: "lc-up/latest", Planned: time.Date(2026, 12, 5, 10, 49, 17, 0, time.UTC),
			ByDeadline: true, Margin: 529707194 * time.Nanosecond, Attempt: 1},
		{At: time.Date(year, 12, 5, 12, 57, 1, 54399000, time.Local), Pod: "spot/pdb-blocked", Margin: 3388932672 * time.Nanosecond},
		{At: time.Date(2026, 12, 5, 10, 49, 17, 196121160, time.UTC), Pod: "lc-up-v2/latest", Planned: time.Date(2026, 12, 5, 10, 49, 18, 0, time.UTC),
			ByDeadline: true, Margin: 305005139 * time.Nanosecond, Attempt: 2},
	}
	if len(sends) != len(want) {
		t.Fatalf("read %d sends, want %d: %+v", len(sends), len(want), sends)
	}
	for i, w := range want {
		g := sends[i]
		if !g.At.Equal(w.At) || g.Pod != w.Pod || !g.Planned.Equal(w.Planned) || g.ByDeadline != w.ByDeadline || g.Margin != w.Margin || g.Attempt != w.Attempt {
			t.Errorf("send %d: %+v, want %+v", i, g, w)
		}
	}
}
