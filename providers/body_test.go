package providers

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestLimitedBody: an answer of exactly the limit is read whole; a byte more, or a
// Content-Length over the limit, is ErrTooLarge (the latter before anything is read), for
// that Read and every later one, and OnTooLarge hears of it once.
func TestLimitedBody(t *testing.T) {
	for _, tc := range []struct {
		name     string
		size     int
		declared int64
		wantErr  bool
	}{
		{name: "empty", size: 0, declared: -1},
		{name: "at the limit", size: 64, declared: -1},
		{name: "at the limit, declared", size: 64, declared: 64},
		{name: "a byte over", size: 65, declared: -1, wantErr: true},
		{name: "declared over, nothing read", size: 1, declared: 65, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.NewReader(strings.Repeat("x", tc.size))
			b := NewLimitedBody(io.NopCloser(src), tc.declared, 64)
			told := 0
			b.OnTooLarge = func(err error) {
				told++
				if !errors.Is(err, ErrTooLarge) {
					t.Errorf("OnTooLarge(%v), want ErrTooLarge", err)
				}
			}
			got, err := io.ReadAll(b)
			if tc.wantErr != errors.Is(err, ErrTooLarge) || (!tc.wantErr && err != nil) {
				t.Fatalf("ReadAll: %d bytes, %v; want ErrTooLarge %v", len(got), err, tc.wantErr)
			}
			if !tc.wantErr && len(got) != tc.size {
				t.Errorf("read %d bytes, want %d", len(got), tc.size)
			}
			if tc.declared > 64 && src.Len() != tc.size {
				t.Errorf("read %d bytes of an answer declared over the limit, want none", tc.size-src.Len())
			}
			if _, again := b.Read(make([]byte, 8)); tc.wantErr && !errors.Is(again, ErrTooLarge) {
				t.Errorf("a Read after the limit: %v, want ErrTooLarge again", again)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.wantErr]; told != want {
				t.Errorf("OnTooLarge called %d times, want %d", told, want)
			}
		})
	}
}
