package suite

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The scaling section's plots, one PNG per workload, drawn with gonum/plot
// into the -out directory next to results.md (which links them).

type series struct {
	name   string
	dashed bool
	pts    plotter.XYs
}

// seriesSet keeps series in first-seen order.
type seriesSet struct {
	order []string
	by    map[string]*series
}

func (ss *seriesSet) add(name string, dashed bool, x, y float64) {
	if ss.by == nil {
		ss.by = map[string]*series{}
	}
	s, ok := ss.by[name]
	if !ok {
		s = &series{name: name, dashed: dashed}
		ss.by[name] = s
		ss.order = append(ss.order, name)
	}
	s.pts = append(s.pts, plotter.XY{X: x, Y: y})
}

// colorOf gives each implementation one color in every plot.
func colorOf(impl string) color.Color {
	switch impl {
	case "pgxlock":
		return color.RGBA{R: 0x1f, G: 0x5f, B: 0xbf, A: 0xff}
	case "raw pgx":
		return color.RGBA{R: 0xd0, G: 0x40, B: 0x20, A: 0xff}
	case "redislock":
		return color.RGBA{R: 0x30, G: 0x90, B: 0x30, A: 0xff}
	case "etcd":
		return color.RGBA{R: 0x90, G: 0x40, B: 0xa0, A: 0xff}
	case modeDedicated: // the held section's modes
		return color.RGBA{R: 0xd0, G: 0x40, B: 0x20, A: 0xff}
	case modeMultiplexed:
		return color.RGBA{R: 0x1f, G: 0x5f, B: 0xbf, A: 0xff}
	}
	return color.Gray{Y: 0x60}
}

func drawSeries(p *plot.Plot, ss *seriesSet, implOf func(name string) string) error {
	for i, name := range ss.order {
		s := ss.by[name]
		sort.Slice(s.pts, func(a, b int) bool { return s.pts[a].X < s.pts[b].X })
		l, pts, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return err
		}
		c := colorOf(implOf(name))
		l.Color, pts.Color = c, c
		l.Width = vg.Points(1.5)
		pts.Shape = plotutil.Shape(i)
		pts.Radius = vg.Points(3)
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(l, pts)
		p.Legend.Add(name, l, pts)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return nil
}

func intTicks(xs ...int) plot.ConstantTicks {
	var t plot.ConstantTicks
	for _, x := range xs {
		t = append(t, plot.Tick{Value: float64(x), Label: strconv.Itoa(x)})
	}
	return t
}

// logTicks labels every power of ten between lo and hi.
func logTicks(lo, hi float64) plot.ConstantTicks {
	var t plot.ConstantTicks
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		v := math.Pow(10, e)
		label := strconv.FormatFloat(v, 'f', -1, 64)
		if v >= 1000 {
			label = fmt.Sprintf("%gk", v/1000)
		}
		t = append(t, plot.Tick{Value: v, Label: label})
	}
	return t
}

// drawScalingPlots writes the PNGs of the scaling section into dir and
// returns their file names.
func drawScalingPlots(dir string, sc *ScalingResults) ([]string, error) {
	if sc == nil || dir == "" {
		return nil, nil
	}
	var files []string
	save := func(p *plot.Plot, name string) error {
		if err := p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, name)); err != nil {
			return err
		}
		files = append(files, name)
		return nil
	}
	impl := map[string]string{}

	// Processes: acquisitions/s against the number of processes, one line
	// per contender and key count (16 keys dashed), log y (the peers are an
	// order of magnitude apart).
	var ps seriesSet
	lo, hi := math.Inf(1), 0.0
	for _, r := range sc.Processes {
		if r.Unavailable != "" || r.PerSec <= 0 {
			continue
		}
		name := fmt.Sprintf("%s, %d key(s)", r.Impl, r.Config.Keys)
		impl[name] = r.Impl
		ps.add(name, r.Config.Keys > 1, float64(r.Config.Procs), r.PerSec)
		lo, hi = math.Min(lo, r.PerSec), math.Max(hi, r.PerSec)
	}
	if len(ps.order) > 0 {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("Processes contending (each: pool %d, %d goroutines; lock, no work, unlock)", procPool, procGoroutines)
		p.X.Label.Text = "OS processes"
		p.Y.Label.Text = "acquisitions/s, all processes (log)"
		p.X.Tick.Marker = intTicks(1, 2, 4, 8)
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks(lo, hi)
		if err := drawSeries(p, &ps, func(n string) string { return impl[n] }); err != nil {
			return files, err
		}
		p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(lo))), hi*8 // room for the legend
		if err := save(p, "scaling-processes.png"); err != nil {
			return files, err
		}
	}

	// Keys: mean cost per key against keys held at once, log-log;
	// transaction scope dashed.
	var ks seriesSet
	lo, hi = math.Inf(1), 0.0
	for _, r := range sc.Keys {
		if r.Skipped != "" || r.Calls == 0 {
			continue
		}
		impl[r.Row] = r.Impl
		ks.add(r.Row, scopeOf(r.Row) == "xact", float64(r.Keys), r.PerKeyUS)
		lo, hi = math.Min(lo, r.PerKeyUS), math.Max(hi, r.PerKeyUS)
	}
	if len(ks.order) > 0 {
		p := plot.New()
		p.Title.Text = "Keys held at once by one caller (take N keys, release them)"
		p.X.Label.Text = "keys held at once (log)"
		p.Y.Label.Text = "mean µs per key (log)"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker = intTicks(keysCounts...)
		p.Y.Tick.Marker = logTicks(lo, hi)
		if err := drawSeries(p, &ks, func(n string) string { return impl[n] }); err != nil {
			return files, err
		}
		p.Legend.Left = false
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo)))
		if err := save(p, "scaling-keys.png"); err != nil {
			return files, err
		}
	}

	// Pinned: unrelated queries/s as a share of the baseline against the
	// waiters, per implementation.
	var pn seriesSet
	for _, r := range sc.Pinned {
		if r.Waiters == 0 || r.UnrelatedResult == nil {
			continue
		}
		name := r.Impl + fmt.Sprintf(" (pool %d)", unrelatedPool)
		impl[name] = r.Impl
		pn.add(name, false, float64(r.Waiters), r.Paired)
	}
	if len(pn.order) > 0 {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("Unrelated SELECT 1 (%d goroutines, pool %d) while W goroutines wait on a held key", unrelatedQueries, unrelatedPool)
		p.X.Label.Text = "goroutines waiting on the key (log)"
		p.Y.Label.Text = "queries/s vs queries-only baseline (paired)"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = intTicks(1, 4, 16, 64)
		p.Y.Min, p.Y.Max = 0, 1.3
		if err := drawSeries(p, &pn, func(n string) string { return impl[n] }); err != nil {
			return files, err
		}
		p.Legend.Top = false
		p.Legend.Left = true
		if err := save(p, "scaling-pinned.png"); err != nil {
			return files, err
		}
	}
	return files, nil
}

// drawHeldPlot writes the held section's plot: the Locker's backends against
// the handles asked for, one line per mode and pool, log-log.
func drawHeldPlot(dir string, h *HeldResults) ([]string, error) {
	if h == nil || len(h.Points) == 0 {
		return nil, nil
	}
	var ss seriesSet
	mode := map[string]string{}
	hi, maxH := 1.0, 1
	for _, r := range h.Points {
		if r.Skipped != "" || r.Backends <= 0 {
			continue
		}
		pool := fmt.Sprintf("pool %d", heldPool)
		if r.Pool != heldPool {
			pool = "pool H+2"
		}
		name := fmt.Sprintf("%s, %s", r.Mode, pool)
		if r.Mode == modeMultiplexed {
			name += " (Config default)"
		}
		mode[name] = r.Mode
		ss.add(name, r.Pool != heldPool, float64(r.Held), float64(r.Backends))
		hi, maxH = math.Max(hi, float64(r.Backends)), max(maxH, r.Held)
	}
	if len(ss.order) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Connections needed vs locks held by one process (TryLock handles on distinct keys)"
	p.X.Label.Text = "locks held at once (asked; a dedicated point that fails holds fewer: see the table) (log)"
	p.Y.Label.Text = "the Locker's backends in pg_stat_activity (log)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = logTicks(1, float64(maxH))
	p.Y.Tick.Marker = logTicks(1, hi)
	if err := drawSeries(p, &ss, func(n string) string { return mode[n] }); err != nil {
		return nil, err
	}
	p.Y.Min, p.Y.Max = 1, hi*8 // room for the legend
	name := "held-connections.png"
	if err := p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, name)); err != nil {
		return nil, err
	}
	return []string{name}, nil
}
