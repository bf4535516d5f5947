package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery/targetgroup"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/scrape"
	"github.com/prometheus/prometheus/tsdb"
)

type scrapeInput struct {
	Config  string                         `json:"config"`
	Targets map[string][]map[string]string `json:"targets"`
	Scrapes int                            `json:"scrapes"`
	Exprs   []string                       `json:"exprs"`
}

type scrapeOutput struct {
	Results []any               `json:"results"`
	Series  []map[string]string `json:"series"`
}

func scrapeAndQuery() int {
	var in scrapeInput
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck scrape: stdin must be {\"config\", \"targets\", \"scrapes\", \"exprs\"}:", err)
		return 2
	}
	logger := promslog.NewNopLogger()
	cfg, err := config.Load(in.Config, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck scrape: config:", oneLine(err))
		return 2
	}
	dir, err := os.MkdirTemp("", "promqlcheck-tsdb-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck scrape:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	db, err := tsdb.Open(dir, logger, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck scrape: tsdb:", err)
		return 2
	}
	defer db.Close()
	manager, err := scrape.NewManager(&scrape.Options{DiscoveryReloadInterval: model.Duration(100 * time.Millisecond)},
		logger, nil, db, nil, prometheus.NewRegistry())
	if err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck scrape: manager:", err)
		return 2
	}
	if err := manager.ApplyConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck scrape: apply:", oneLine(err))
		return 2
	}
	groups := map[string][]*targetgroup.Group{}
	for job, targets := range in.Targets {
		group := &targetgroup.Group{Source: job}
		for _, target := range targets {
			set := model.LabelSet{}
			for k, v := range target {
				set[model.LabelName(k)] = model.LabelValue(v)
			}
			group.Targets = append(group.Targets, set)
		}
		groups[job] = []*targetgroup.Group{group}
	}
	tsets := make(chan map[string][]*targetgroup.Group, 1)
	tsets <- groups
	go manager.Run(tsets)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10000000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	// Until every target was scraped `scrapes` times (`up` has one sample per scrape), at most a minute.
	want := fmt.Sprintf("count(count_over_time(up[10m]) >= %d) == %d", in.Scrapes, countTargets(in.Targets))
	deadline := time.Now().Add(time.Minute)
	for {
		if n, _ := query(engine, db, want, time.Now()); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			manager.Stop()
			fmt.Fprintln(os.Stderr, "promqlcheck scrape: the targets were not scraped", in.Scrapes, "times within a minute")
			return 1
		}
		time.Sleep(200 * time.Millisecond)
	}
	manager.Stop()
	now := time.Now()
	out := scrapeOutput{Results: []any{}, Series: []map[string]string{}}
	for _, expr := range in.Exprs {
		n, err := query(engine, db, expr, now)
		if err != nil {
			out.Results = append(out.Results, oneLine(err))
			continue
		}
		out.Results = append(out.Results, n)
	}
	querier, err := db.Querier(0, now.UnixMilli())
	if err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck scrape: querier:", err)
		return 2
	}
	defer querier.Close()
	set := querier.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	for set.Next() {
		out.Series = append(out.Series, set.At().Labels().Map())
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 2
	}
	return 0
}

func countTargets(targets map[string][]map[string]string) int {
	n := 0
	for _, t := range targets {
		n += len(t)
	}
	return n
}

// query evaluates an instant query: the number of series it returns (1 for a scalar).
func query(engine *promql.Engine, db *tsdb.DB, expr string, at time.Time) (int, error) {
	q, err := engine.NewInstantQuery(context.Background(), db, nil, expr, at)
	if err != nil {
		return 0, err
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return 0, res.Err
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return len(v), nil
	case promql.Scalar:
		return 1, nil
	default:
		return 0, fmt.Errorf("not an instant vector: %s", res.Value.Type())
	}
}
