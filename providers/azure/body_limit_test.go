package azure

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPollBoundsAnEndlessAnswer (issue 39 item 4): Azure read at most maxBody of an answer, but
// silently, so that an endless one failed as JSON that ends early. It fails as too large, and
// names the limit, as the AWS and GCP providers' answers do; it still reads little more than
// the limit.
func TestPollBoundsAnEndlessAnswer(t *testing.T) {
	for _, status := range []int{http.StatusOK, http.StatusInternalServerError} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			s := newScripted(t)
			s.script(eventsPath, reply{status: status, endless: true})
			p, _ := newProvider(t, s.srv.URL)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := p.Poll(ctx)
			if err == nil {
				t.Fatalf("Poll: no error; want %v", ErrTooLarge)
			}
			if !errors.Is(err, ErrTooLarge) || ctx.Err() != nil {
				t.Errorf("Poll: %v; want %v, before the deadline", err, ErrTooLarge)
			}
			if want := strconv.Itoa(maxBody); !strings.Contains(err.Error(), want) {
				t.Errorf("Poll: %q does not name the limit (%s bytes)", err, want)
			}
			// What the fake could hand to the kernel before the client stopped reading: the
			// limit, and what the two ends' socket buffers hold.
			if got := s.streamed.Load(); got >= endlessCap {
				t.Errorf("the fake streamed %d bytes, its cap: the client read to the end", got)
			}
			t.Logf("the fake streamed %d bytes (limit %d)", s.streamed.Load(), maxBody)
		})
	}
}
