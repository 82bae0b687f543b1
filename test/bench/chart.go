package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Bar colours of the timelines.
var (
	colorFull      = color.RGBA{R: 0x2e, G: 0x7d, B: 0x32, A: 0xff} // gone in time with its whole grace
	colorShortened = color.RGBA{R: 0xf9, G: 0xa8, B: 0x25, A: 0xff} // gone in time, grace shortened
	colorLate      = color.RGBA{R: 0xc6, G: 0x28, B: 0x28, A: 0xff} // still there at the deadline
	colorDeadline  = color.Black
	colorMargin    = color.Gray{Y: 0x80}
)

// writeTimelines draws one timeline per side of a compliance run into an SVG file: each pod a
// bar from its eviction to its end, the reclaim deadline as a line.
func writeTimelines(path string, r *complianceRun) error {
	// Liberation Sans has Arial's and Helvetica's metrics, so text laid out for it fits where a
	// viewer substitutes either (the fonts are not embedded, which would add half a megabyte).
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	plotter.DefaultFont = plot.DefaultFont
	plots := make([][]*plot.Plot, len(r.Sides))
	xmax := r.Length.Seconds() * 1.5
	for i := range r.Sides {
		p, err := timeline(&r.Sides[i], r, xmax)
		if err != nil {
			return err
		}
		plots[i] = []*plot.Plot{p}
	}
	return writeSVG(path, plots, 9*vg.Inch, 11*vg.Inch)
}

// writeSVG lays plots out in a grid of rows and columns on one page and writes it as SVG, with
// the font family falling back to the viewer's Arial or Helvetica.
func writeSVG(path string, plots [][]*plot.Plot, width, height vg.Length) error {
	img := vgsvg.NewWith(vgsvg.UseWH(width, height), vgsvg.EmbedFonts(false))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	var svg strings.Builder
	if _, err := img.WriteTo(&svg); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	out := strings.ReplaceAll(svg.String(), "font-family:Liberation Sans;", "font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")
	if _, err := f.WriteString(out); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func timeline(s *sideResult, r *complianceRun, xmax float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, %s window of %s\n%d/%d evictable pods gone by the deadline, %d with their full grace",
		s.Name, windowName(r.Window), r.Length, s.Gone, s.Evictable, s.FullGrace)
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = "seconds after the notice"
	p.Y.Label.Text = "pods, by eviction time"
	p.X.Min, p.X.Max = -2, xmax
	// Room above the bars for the legend.
	p.Y.Min, p.Y.Max = -1, float64(len(s.Pods))+max(5, 0.2*float64(len(s.Pods)))
	rel := func(t time.Time) float64 { return t.Sub(r.Notice).Seconds() }
	legend := map[string]bool{}
	for i, o := range s.Pods {
		if o.NeverEvicted {
			continue
		}
		start, end := rel(o.Evicted), min(rel(o.End), xmax)
		c, label := colorFull, "gone in time, full grace"
		switch {
		case o.Projected || o.End.After(r.Deadline):
			c, label = colorLate, "still there at the deadline"
		case o.GraceGiven != o.Pod.GraceSeconds():
			c, label = colorShortened, "gone in time, grace shortened"
		}
		if start > xmax {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: start, Y: float64(i)}, {X: max(end, start+0.2), Y: float64(i)}})
		if err != nil {
			return nil, fmt.Errorf("drawing pod %s: %w", o.Pod.Name, err)
		}
		l.LineStyle.Color, l.LineStyle.Width = c, vg.Points(2)
		if o.Projected {
			l.LineStyle.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
		}
		p.Add(l)
		if !legend[label] {
			legend[label] = true
			p.Legend.Add(label, l)
		}
	}
	d := r.Length.Seconds()
	for _, m := range []struct {
		x     float64
		c     color.Color
		label string
		dash  bool
	}{{d, colorDeadline, "reclaim deadline", false}, {d - r.Margin.Seconds(), colorMargin, "deadline - safety margin", true}} {
		l, err := plotter.NewLine(plotter.XYs{{X: m.x, Y: -1}, {X: m.x, Y: float64(len(s.Pods))}})
		if err != nil {
			return nil, fmt.Errorf("drawing the deadline: %w", err)
		}
		l.LineStyle.Color, l.LineStyle.Width = m.c, vg.Points(1.5)
		if m.dash {
			l.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(m.label, l)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(6)
	p.Add(plotter.NewGrid())
	return p, nil
}

func windowName(w string) string {
	switch w {
	case "aws":
		return "AWS spot"
	case "gcp":
		return "GCP preemption"
	}
	return w
}
