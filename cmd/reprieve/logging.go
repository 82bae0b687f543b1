package main

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// setupLogging points klog, and so every contextual logger taken from it, at the format that
// --log-format asks for. text keeps klog's own lines. json writes one JSON object per line
// through log/slog's JSON handler (no zap, no component-base): "time", "level", "msg", then the
// structured keys as they are logged; -v still decides which verbose lines are written.
func setupLogging(format string, verbosity int, w io.Writer) error {
	switch format {
	case "text":
		return nil
	case "json":
		h := slog.NewJSONHandler(w, &slog.HandlerOptions{
			// logr's V(n) is slog level -n: -v=2 lets V(0) to V(2) through.
			Level: slog.Level(-verbosity),
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				// V(1) would print as "DEBUG+3": every verbosity of Info is INFO to a log
				// pipeline, errors stay ERROR.
				if a.Key == slog.LevelKey {
					if l, ok := a.Value.Any().(slog.Level); ok && l < slog.LevelInfo {
						a.Value = slog.StringValue(slog.LevelInfo.String())
					}
				}
				return a
			},
		})
		// Contextual: klog.Background() and klog.FromContext hand out this logger itself, so
		// the handler's level (not klog's own -v check, which drops V(n) for n > 0 in front
		// of a plain SetLogger) decides the verbose lines.
		klog.SetLoggerWithOptions(logr.FromSlogHandler(h), klog.ContextualLogger(true))
		return nil
	default:
		return fmt.Errorf("--log-format %q: must be text or json", format)
	}
}

// verbosity reads klog's -v from fs (0 when it is absent or does not parse).
func verbosity(fs *pflag.FlagSet) int {
	f := fs.Lookup("v")
	if f == nil {
		return 0
	}
	v, err := strconv.Atoi(f.Value.String())
	if err != nil {
		return 0
	}
	return v
}
