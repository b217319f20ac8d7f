package suite

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Target is one of issue 7's targets, evaluated on this run.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  string `json:"met"` // "yes", "no", or "n/a" (not measured / a judgement)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func findUC(res *Results, group, row string) *UncontendedResult {
	for _, r := range res.Uncontended {
		if r.Group == group && r.Row == row && r.Unavailable == "" && r.Ops > 0 {
			return r
		}
	}
	return nil
}

func findCT(res *Results, section string, cfg ContentionConfig, row string) *ContentionResult {
	for _, r := range res.Contention {
		if r.Section == section && r.Config == cfg && r.Row == row && r.Unavailable == "" {
			return r
		}
	}
	return nil
}

func evaluateTargets(res *Results) []Target {
	var out []Target
	add := func(name, want, got string, met string) {
		out = append(out, Target{Name: name, Want: want, Got: got, Met: met})
	}
	if r := findUC(res, "session lock+unlock", pgxlockWithLock.Name); r != nil {
		add("session helper vs raw lock+unlock (mean, paired)", "<= 1.05x", fmt.Sprintf("%.3fx", r.PairedRatio), yesNo(r.PairedRatio <= 1.05))
		add("session helper vs raw lock+unlock (p50)", "<= 1.05x", fmt.Sprintf("%.3fx", r.P50Ratio), yesNo(r.P50Ratio <= 1.05))
		add("session helper vs raw lock+unlock (p99)", "<= 1.10x", fmt.Sprintf("%.3fx", r.P99Ratio), yesNo(r.P99Ratio <= 1.10))
	}
	for _, aa := range []struct{ group, row string }{
		{"session lock+unlock", rawLockUnlockAA.Name},
		{"xact helper", rawXactPipelinedAA.Name},
	} {
		if r := findUC(res, aa.group, aa.row); r != nil {
			add(aa.group+": A/A control, the baseline's code vs itself (mean, paired)", "n/a (noise floor)", fmt.Sprintf("%.3fx", r.PairedRatio), "n/a")
			add(aa.group+": A/A control, the baseline's code vs itself (p50)", "n/a (noise floor)", fmt.Sprintf("%.3fx", r.P50Ratio), "n/a")
		}
	}
	if r := findUC(res, "xact helper", pgxlockWithXactLock.Name); r != nil {
		add("xact helper vs raw pipelined [BEGIN+lock]; COMMIT (mean, paired)", "<= 1.05x", fmt.Sprintf("%.3fx", r.PairedRatio), yesNo(r.PairedRatio <= 1.05))
		add("xact helper vs raw pipelined [BEGIN+lock]; COMMIT (p50)", "<= 1.05x", fmt.Sprintf("%.3fx", r.P50Ratio), yesNo(r.P50Ratio <= 1.05))
	}
	if r, cb := findUC(res, "xact batch (3 writes)", pgxlockXactBatch3.Name), findUC(res, "xact batch (3 writes)", pgxlockWithXactLock3.Name); r != nil && cb != nil {
		add("xact batch, 3 writes, vs the same pipeline by hand (mean, paired)", "<= 1.05x", fmt.Sprintf("%.3fx", r.PairedRatio), yesNo(r.PairedRatio <= 1.05))
		add("xact batch, 3 writes, vs the callback form (mean, paired)", "<= 0.6x", fmt.Sprintf("%.3fx", r.PairedRatio/cb.PairedRatio), yesNo(r.PairedRatio/cb.PairedRatio <= 0.6))
		if rr := findUC(res, "xact batch (3 writes)", rawXactBatch3Reset.Name); rr != nil {
			add("xact batch, 3 writes, vs the same pipeline by hand with the session reset (mean, paired)", "n/a (context)", fmt.Sprintf("%.3fx", r.PairedRatio/rr.PairedRatio), "n/a")
		}
	}
	for _, g := range []struct{ group, row string }{
		{"multi-key session (10 keys)", pgxlockWithLockAll.Name + " (10 keys)"},
		{"multi-key xact (10 keys)", pgxlockWithXactLockAll.Name + " (10 keys)"},
	} {
		if r := findUC(res, g.group, g.row); r != nil {
			add(g.group+": 10 keys vs 1 key (mean, paired)", "<= 1.10x", fmt.Sprintf("%.3fx", r.PairedRatio), yesNo(r.PairedRatio <= 1.10))
			add(g.group+": 10 keys vs 1 key (p50)", "<= 1.10x", fmt.Sprintf("%.3fx", r.P50Ratio), yesNo(r.P50Ratio <= 1.10))
		}
	}
	for _, pool := range []int{10, 50} {
		for _, g := range []int{8, 32, 64} {
			cfg := ContentionConfig{Keys: 1, Goroutines: g, Pool: pool}
			if r := findCT(res, "contention", cfg, pgxlockWithLock.Name); r != nil {
				add(fmt.Sprintf("one key, no work, %d goroutines, pool %d: throughput vs raw (paired)", g, pool), ">= 0.95x",
					fmt.Sprintf("%.3fx", r.PairedRatio), yesNo(r.PairedRatio >= 0.95))
				add(fmt.Sprintf("one key, no work, %d goroutines, pool %d: hand-off p50", g, pool), "<= 20 us",
					fmtUS(r.Handoff.P50), yesNo(r.Handoff.N > 0 && r.Handoff.P50 <= 20))
			}
		}
	}
	fair := ContentionConfig{Keys: 1, Goroutines: 32, Pool: 50, Work: time.Millisecond}
	if r := findCT(res, "fairness", fair, pgxlockWithLock.Name); r != nil {
		add("one key, 1 ms work, 32 goroutines: throughput vs raw (paired)", ">= 0.95x", fmt.Sprintf("%.3fx", r.PairedRatio), yesNo(r.PairedRatio >= 0.95))
		add("one key, 1 ms work, 32 goroutines: per-goroutine min/max", ">= 0.95", fmt.Sprintf("%.3f (%d/%d)", r.PerGoroutine.MinMax, r.PerGoroutine.Min, r.PerGoroutine.Max), yesNo(r.PerGoroutine.MinMax >= 0.95))
	}
	for _, p := range [][2]string{
		{"session lock+unlock", pgxlockWithLock.Name + "|" + rawLockUnlock.Name},
		{"xact helper", pgxlockWithXactLock.Name + "|" + rawXactPipelined.Name},
		{"try+unlock", pgxlockTryWithLock.Name + "|" + rawTryUnlock.Name},
	} {
		a, b, _ := strings.Cut(p[1], "|")
		ra, rb := findUC(res, p[0], a), findUC(res, p[0], b)
		if ra != nil && rb != nil {
			add(p[0]+": allocations per call vs raw", "raw + a small constant",
				fmt.Sprintf("%.0f vs %.0f (+%.0f; %.0f B vs %.0f B)", ra.AllocsPerOp, rb.AllocsPerOp, ra.AllocsPerOp-rb.AllocsPerOp, ra.BytesPerOp, rb.BytesPerOp), "n/a")
		}
	}
	for _, r := range res.Unrelated {
		if r.Impl == "pgxlock" {
			add("unrelated queries, "+r.Scenario+" (paired)", ">= 0.90x baseline", fmt.Sprintf("%.3fx", r.Paired), yesNo(r.Paired >= 0.90))
		}
	}
	return out
}

func fmtUS(us float64) string {
	switch {
	case us == 0:
		return "-"
	case us >= 10000:
		return fmt.Sprintf("%.1f ms", us/1000)
	case us >= 100:
		return fmt.Sprintf("%.0f µs", us)
	default:
		return fmt.Sprintf("%.1f µs", us)
	}
}

func fmtX(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x)
}

// Markdown renders the results as tables.
func Markdown(res *Results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := res.Meta
	p("# pgxlock benchmark results\n\n")
	p("- command: `%s`%s\n", m.Command, map[bool]string{true: " (quick mode: smoke numbers only)", false: ""}[m.Quick])
	p("- started %s, finished %s\n", m.Started.Format(time.RFC3339), m.Finished.Format(time.RFC3339))
	p("- machine: %d CPUs (%s), %s memory, kernel %s\n", m.NumCPU, m.CPUModel, m.MemTotal, m.Kernel)
	p("- load average before / after: %s / %s\n", orDash(m.LoadBefore), orDash(m.LoadAfter))
	p("- Go %s; %s\n", m.GoVersion, m.Postgres)
	p("- library: %s\n", orDash(m.Library))
	p("- PostgreSQL settings: %s\n", m.PGSettings)
	p("- Redis %s; etcd %s\n", orDash(m.Redis), orDash(m.Etcd))
	mods := make([]string, 0, len(m.Modules))
	for k, v := range m.Modules {
		mods = append(mods, k+" "+v)
	}
	sort.Strings(mods)
	p("- modules: %s\n", strings.Join(mods, ", "))
	p("- polling peers retry every %s\n", m.Poll)
	keys := make([]string, 0, len(m.Params))
	for k := range m.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p("- %s: %s\n", k, m.Params[k])
	}
	for k, v := range m.Unavailable {
		p("- **%s unavailable**: %s\n", k, v)
	}

	if len(res.Targets) > 0 {
		p("\n## Targets (issue 7)\n\n| target | want | got | met |\n|---|---|---|---|\n")
		for _, t := range res.Targets {
			p("| %s | %s | %s | %s |\n", t.Name, t.Want, t.Got, t.Met)
		}
	}

	if len(res.Uncontended) > 0 {
		p("\n## Uncontended: one goroutine, acquire + empty critical section + release\n")
		group := ""
		for _, r := range res.Uncontended {
			if r.Group != group {
				group = r.Group
				p("\n### %s (ratios against %s)\n\n", group, r.Baseline)
				p("| contender | calls/s | mean | p50 | p99 | x mean (paired) | x mean | x p50 | x p99 | round trips | allocs | bytes | errors |\n")
				p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			}
			if r.Unavailable != "" {
				p("| %s | unavailable: %s |||||||||||\n", r.Row, oneLine(r.Unavailable))
				continue
			}
			p("| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %.2f | %.0f | %.0f | %d |\n", r.Row, r.OpsPerSec, fmtUS(r.Lat.Mean), fmtUS(r.Lat.P50),
				fmtUS(r.Lat.P99), fmtX(r.PairedRatio), fmtX(r.MeanRatio), fmtX(r.P50Ratio), fmtX(r.P99Ratio), r.RTPerOp, r.AllocsPerOp, r.BytesPerOp, r.Errors)
		}
	}

	var ct, fair []*ContentionResult
	for _, r := range res.Contention {
		if r.Section == "fairness" {
			fair = append(fair, r)
		} else {
			ct = append(ct, r)
		}
	}
	if len(ct) > 0 {
		p("\n## Contention: G goroutines loop lock, no work, unlock; one key or a random one of 16\n\n")
		p("Hand-off: end of the previous holder's critical section to the start of the next waiter's. x raw: throughput against raw pgx at the same point; paired: median over rounds of the ratio between adjacent slices.\n")
		cfg := ContentionConfig{Keys: -1}
		for _, r := range ct {
			if r.Config != cfg {
				cfg = r.Config
				p("\n### %s\n\n", cfg)
				p("| contender | acq/s | x raw (paired) | x raw | wait p50 | wait p99 | hand-off p50 | hand-off p99 | per-goroutine min/med/max | errors | violations |\n")
				p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			}
			if r.Unavailable != "" {
				p("| %s | unavailable: %s ||||||||||\n", r.Row, oneLine(r.Unavailable))
				continue
			}
			p("| %s | %.0f | %s | %s | %s | %s | %s | %s | %d/%.0f/%d | %d | %d |\n", r.Row, r.PerSec, fmtX(r.PairedRatio), fmtX(r.Ratio), fmtUS(r.Wait.P50), fmtUS(r.Wait.P99),
				fmtUS(r.Handoff.P50), fmtUS(r.Handoff.P99), r.PerGoroutine.Min, r.PerGoroutine.Median, r.PerGoroutine.Max, r.Errors, r.Violations)
		}
	}
	if len(fair) > 0 {
		p("\n## Fairness: %s\n\n", fair[0].Config)
		p("| contender | acq/s | x raw (paired) | x raw | min | median | max | min/max | Jain | hand-off p50 | hand-off p99 | wait p99 | errors | violations |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range fair {
			if r.Unavailable != "" {
				p("| %s | unavailable: %s |||||||||||||\n", r.Row, oneLine(r.Unavailable))
				continue
			}
			s := r.PerGoroutine
			p("| %s | %.0f | %s | %s | %d | %.0f | %d | %.3f | %.3f | %s | %s | %s | %d | %d |\n", r.Row, r.PerSec, fmtX(r.PairedRatio), fmtX(r.Ratio), s.Min, s.Median, s.Max,
				s.MinMax, s.Jain, fmtUS(r.Handoff.P50), fmtUS(r.Handoff.P99), fmtUS(r.Wait.P99), r.Errors, r.Violations)
		}
	}
	if len(res.Unrelated) > 0 {
		p("\n## Unrelated queries: `SELECT 1` from %d goroutines through a pool of %d, while %d goroutines use a lock through the same pool\n\n", unrelatedQueries, unrelatedPool, unrelatedLockers)
		p("| scenario | queries/s | x baseline (paired) | x baseline | query p50 | query p99 | lock acquisitions | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range res.Unrelated {
			p("| %s | %.0f | %s | %s | %s | %s | %d | %d |\n", r.Scenario, r.QPS, fmtX(r.Paired), fmtX(r.Ratio), fmtUS(r.Lat.P50), fmtUS(r.Lat.P99), r.LockAcq, r.Errors)
		}
	}
	scalingMarkdown(&b, res.Scaling)
	heldMarkdown(&b, res.Held)
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}
