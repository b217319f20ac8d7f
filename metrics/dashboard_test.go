package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/pgxlock/pgxlock/advisory"
	"github.com/pgxlock/pgxlock/keys"
	"github.com/pgxlock/pgxlock/lease"
	"github.com/pgxlock/pgxlock/metrics"
)

// exportedSeries feeds a Collector one of every event and returns the
// series names a scrape shows (histograms as _bucket, _sum and _count),
// each with its label names.
func exportedSeries(t *testing.T) map[string]map[string]bool {
	c := metrics.New(metrics.Options{})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	ctx := context.Background()
	start := advisory.TraceAcquireStartData{Keys: []keys.Key{keys.Int64(1)}, Scope: advisory.ScopeSession}
	sctx := c.TraceAcquireStart(ctx, start)
	c.TraceAcquireEnd(sctx, advisory.TraceAcquireEndData{TraceAcquireStartData: start, Outcome: advisory.OutcomeAcquired})
	c.TraceRelease(sctx, advisory.TraceReleaseData{Keys: start.Keys, Scope: start.Scope})
	c.TraceLost(sctx, advisory.TraceLostData{Keys: start.Keys, Err: advisory.ErrLockLost})
	c.TraceRenew(ctx, lease.TraceRenewData{Form: lease.FormManager, Err: errors.New("x")})
	mfs, err := reg.Gather()
	require.NoError(t, err)
	series := map[string]map[string]bool{}
	add := func(name string, labels map[string]bool) { series[name] = labels }
	for _, mf := range mfs {
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = true
			}
		}
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			bucket := map[string]bool{"le": true}
			for l := range labels {
				bucket[l] = true
			}
			add(mf.GetName()+"_bucket", bucket)
			add(mf.GetName()+"_sum", labels)
			add(mf.GetName()+"_count", labels)
			continue
		}
		add(mf.GetName(), labels)
	}
	require.Len(t, mfs, 7, "every family of the collector is fed")
	return series
}

// scrapeLabels are the target labels Prometheus adds to every series.
var scrapeLabels = map[string]bool{"job": true, "instance": true}

var (
	seriesName = regexp.MustCompile(`\bpgxlock_[a-z_]+\b`)
	byClause   = regexp.MustCompile(`\bby \(([^)]*)\)`)
	matcher    = regexp.MustCompile(`\b(pgxlock_[a-z_]+)\{([^}]*)\}`)
	matcherKey = regexp.MustCompile(`([a-z_]+)\s*(=~|!=|!~|=)`)
)

// Every query of the Grafana dashboard (metrics/grafana-dashboard.json)
// names series the Collector exports, with labels those series have; and
// every family of the Collector is on the dashboard.
func TestDashboardQueriesNameExportedSeries(t *testing.T) {
	raw, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	series := exportedSeries(t)

	var exprs []string
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
			exprs = append(exprs, tg.Expr)
		}
	}
	panelExprs := len(exprs)
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			exprs = append(exprs, v.Definition)
		}
	}
	require.GreaterOrEqual(t, len(exprs), 7)
	for _, e := range exprs[:panelExprs] {
		for _, m := range matcher.FindAllStringSubmatch(e, -1) {
			require.Contains(t, m[2], `job=~"$job"`, "query %q is not filtered by the job variable", e)
			require.Contains(t, m[2], `instance=~"$instance"`, "query %q is not filtered by the instance variable", e)
		}
	}
	var vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name)
	}
	require.Subset(t, vars, []string{"job", "instance", "namespace"}, "the dashboard's template variables")

	used := map[string]bool{}
	for _, e := range exprs {
		names := seriesName.FindAllString(e, -1)
		require.NotEmpty(t, names, "query %q names no pgxlock series", e)
		for _, n := range names {
			labels, ok := series[n]
			require.True(t, ok, "query %q: the collector exports no series %s", e, n)
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
			for _, m := range matcher.FindAllStringSubmatch(e, -1) {
				if m[1] != n {
					continue
				}
				for _, k := range matcherKey.FindAllStringSubmatch(m[2], -1) {
					if scrapeLabels[k[1]] {
						continue // added by Prometheus to every series it scrapes
					}
					require.True(t, labels[k[1]], "query %q: %s has no label %s", e, n, k[1])
				}

			}
			for _, by := range byClause.FindAllStringSubmatch(e, -1) {
				for _, l := range strings.Split(by[1], ",") {
					l = strings.TrimSpace(l)
					require.True(t, labels[l], "query %q: %s has no label %s to aggregate by", e, n, l)
				}
			}
		}
	}
	var families []string
	for n := range series {
		families = append(families, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count"))
	}
	sort.Strings(families)
	for _, f := range families {
		require.True(t, used[f], "the dashboard shows nothing of %s", f)
	}
}
