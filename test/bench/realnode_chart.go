package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// realnodeChartName is the chart -realnode-chart draws, in -svg-dir.
const realnodeChartName = "benchmarks-realnode-pressure.svg"

// The colours of the two runs of each signal: reprieve's green, the kubelet's red.
var runColors = []color.Color{colorFull, colorLate}

// The moments marked on the curves (the names test/realnode records), with their short labels.
var realnodeMarks = []struct{ what, label string }{
	{"reprieve's taint on the node", "taint"},
	{"SIGTERM in the hog", "SIGTERM"},
	{"the kubelet's pressure condition", "kubelet's condition"},
}

// writeRealnodeChart draws the pressure timelines measured on the real node (test/realnode,
// REPRIEVE_REALNODE_FIGURES): one panel per signal, the host's reading over time for the run
// with reprieve and the run without, as the amount above each run's own hard threshold (the two
// runs set it from what was free at their start), with both thresholds and the moments that
// matter.
func writeRealnodeChart(path string, files []string) error {
	if len(files) == 0 {
		return errors.New("-realnode-chart: no timeline files")
	}
	var signals []scenario.PressureSignal
	var measured []string
	for _, f := range files {
		tl, err := scenario.ReadPressureTimelines(f)
		if err != nil {
			return err
		}
		signals = append(signals, tl.Signals...)
		measured = append(measured, tl.Measured[:min(10, len(tl.Measured))]+", "+tl.Machine)
	}
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	plotter.DefaultFont = plot.DefaultFont
	var row []*plot.Plot
	for _, s := range signals {
		p, err := pressurePanel(s)
		if err != nil {
			return err
		}
		row = append(row, p)
	}
	plots := make([][]*plot.Plot, len(row))
	for i := range row {
		plots[i] = []*plot.Plot{row[i]}
	}
	if err := writeSVG(path, plots, 9*vg.Inch, vg.Length(len(row))*4.5*vg.Inch); err != nil {
		return err
	}
	fmt.Printf("wrote %s from %s (%s)\n", path, strings.Join(files, ", "), strings.Join(measured, "; "))
	return nil
}

func pressurePanel(s scenario.PressureSignal) (*plot.Plot, error) {
	p := plot.New()
	title := s.Signal + " on the real node"
	if s.Case != "" {
		title += " (" + s.Case + ")"
	}
	kind, field := "hard", "evictionHard"
	if s.Threshold == "soft" {
		kind, field = "soft", "evictionSoft"
	}
	p.Title.Text = title + ", with and without reprieve"
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = "seconds from the hog's start"
	p.Y.Label.Text = "MiB above the kubelet's " + kind + " threshold"
	xmax, ymax, ymin := 0.0, s.OwnAboveMiB, 0.0
	for i, r := range s.Runs {
		c := runColors[min(i, len(runColors)-1)]
		xys := make(plotter.XYs, 0, len(r.Samples))
		for _, v := range r.Samples {
			xys = append(xys, plotter.XY{X: v.At, Y: v.AvailableMiB - r.HardMiB})
			xmax, ymax, ymin = math.Max(xmax, v.At), math.Max(ymax, v.AvailableMiB-r.HardMiB), math.Min(ymin, v.AvailableMiB-r.HardMiB)
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("drawing %s, %s: %w", s.Signal, r.Name, err)
		}
		l.LineStyle.Color, l.LineStyle.Width = c, vg.Points(2)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (evicted by %s)", r.Name, evictor(r.EvictedBy)), l)
		var pts plotter.XYs
		var labels []string
		for _, m := range realnodeMarks {
			for _, mo := range r.Moments {
				if mo.What == m.what {
					pts = append(pts, plotter.XY{X: mo.At, Y: readingAt(r, mo.At) - r.HardMiB})
					labels = append(labels, m.label)
				}
			}
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, fmt.Errorf("drawing %s, %s: %w", s.Signal, r.Name, err)
		}
		sc.GlyphStyle.Color, sc.GlyphStyle.Shape, sc.GlyphStyle.Radius = c, draw.CircleGlyph{}, vg.Points(4)
		p.Add(sc)
		// A label of its own per moment: moments within two seconds of each other (the taint and
		// the SIGTERM, the kubelet's condition and its SIGTERM) stack downwards, and labels in
		// the right quarter end at their point.
		for j, pt := range pts {
			lb, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{pt}, Labels: labels[j : j+1]})
			if err != nil {
				return nil, fmt.Errorf("drawing %s, %s: %w", s.Signal, r.Name, err)
			}
			near := 0
			for _, q := range pts[:j] {
				if math.Abs(q.X-pt.X) < 2 {
					near++
				}
			}
			lb.TextStyle[0].Font.Size = vg.Points(9)
			lb.TextStyle[0].Color = c
			lb.Offset = vg.Point{X: vg.Points(6), Y: vg.Points(4 - 11*float64(near))}
			if pt.X > 0.75*xmaxOf(s) {
				lb.TextStyle[0].XAlign = text.XRight
				lb.Offset.X = -vg.Points(6)
			}
			p.Add(lb)
		}
	}
	for _, m := range []struct {
		y     float64
		c     color.Color
		label string
		dash  bool
	}{{0, colorDeadline, "the kubelet's " + kind + " threshold (" + field + ")", false}, {s.OwnAboveMiB, colorMargin, "reprieve's threshold", true}} {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: m.y}, {X: xmax, Y: m.y}})
		if err != nil {
			return nil, fmt.Errorf("drawing the thresholds: %w", err)
		}
		l.LineStyle.Color, l.LineStyle.Width = m.c, vg.Points(1.5)
		if m.dash {
			l.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(m.label, l)
	}
	p.X.Min, p.X.Max = 0, xmax*1.02
	p.X.Tick.Marker = secondsTicks{}
	p.Y.Min, p.Y.Max = ymin-0.05*(ymax-ymin), ymax+0.5*(ymax-ymin) // room above for the legend
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(6)
	p.Legend.Padding = vg.Points(1.5)
	p.Add(plotter.NewGrid())
	return p, nil
}

// xmaxOf is the last sample's time over all of s's runs.
func xmaxOf(s scenario.PressureSignal) float64 {
	x := 0.0
	for _, r := range s.Runs {
		for _, v := range r.Samples {
			x = math.Max(x, v.At)
		}
	}
	return x
}

// secondsTicks marks whole seconds: every 5 s, or 10 s past a minute, labelled every other.
type secondsTicks struct{}

// Ticks implements plot.Ticker.
func (secondsTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 5.0
	if hi-lo > 60 {
		step = 10
	}
	var ticks []plot.Tick
	for i, v := 0, math.Ceil(lo/step)*step; v <= hi; i, v = i+1, v+step {
		t := plot.Tick{Value: v}
		if int(math.Round(v/step))%2 == 0 {
			t.Label = fmt.Sprintf("%.0f", v)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// readingAt is the run's reading at (or just before) at seconds, for placing a moment on its
// curve.
func readingAt(r scenario.PressureRun, at float64) float64 {
	v := r.Samples[0].AvailableMiB
	for _, s := range r.Samples {
		if s.At > at {
			break
		}
		v = s.AvailableMiB
	}
	return v
}

// evictor names who evicted the hog, from the DisruptionTarget condition's reason.
func evictor(by string) string {
	switch {
	case strings.Contains(by, "EvictionByEvictionAPI"):
		return "reprieve, Eviction API"
	case strings.Contains(by, "TerminationByKubelet"):
		return "the kubelet"
	case by == "":
		return "nobody"
	}
	return by
}
