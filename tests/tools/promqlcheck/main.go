// promqlcheck parses PromQL expressions with Prometheus' own parser: one JSON array of strings on stdin, one
// line per expression on stdout ("ok" or the parse error). `promqlcheck eval` evaluates them instead, with
// Prometheus' own engine, over series given in promqltest's `load` notation: stdin is
// {"load": "...", "at": "2h", "exprs": [...]}, and each line is the number of series the expression returns at
// that time (an alert expression fires where it returns any) or the error. `promqlcheck scrape` scrapes real
// targets with Prometheus' own scrape manager, as a Prometheus with the given configuration would (its
// relabel_configs, honor_labels and metric_relabel_configs applied by Prometheus' code), into a TSDB of its own:
// stdin is {"config": "<prometheus.yml>", "targets": {"<job>": [{"__address__": ..., "__meta_...": ...}]},
// "scrapes": 3, "exprs": [...]}; stdout is one JSON object, {"results": [count or error per expression],
// "series": [the label sets stored]}. Used by tests/e2e/test_monitoring.py.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "eval" {
		os.Exit(evaluate())
	}
	if len(os.Args) > 1 && os.Args[1] == "scrape" {
		os.Exit(scrapeAndQuery())
	}
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck: stdin must be a JSON array of strings:", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	failed := false
	for _, expr := range exprs {
		if _, err := p.ParseExpr(expr); err != nil {
			fmt.Println(oneLine(err))
			failed = true
			continue
		}
		fmt.Println("ok")
	}
	if failed {
		os.Exit(1)
	}
}

type evalInput struct {
	Load  string   `json:"load"`
	At    string   `json:"at"`
	Exprs []string `json:"exprs"`
}

func evaluate() int {
	var in evalInput
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck eval: stdin must be {\"load\", \"at\", \"exprs\"}:", err)
		return 2
	}
	at, err := model.ParseDuration(in.At)
	if err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck eval: at:", err)
		return 2
	}
	loader, err := promqltest.NewLazyLoader(in.Load, promqltest.LazyLoaderOpts{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck eval: load:", oneLine(err))
		return 2
	}
	defer loader.Close()
	ts := time.Unix(0, 0).UTC().Add(time.Duration(at))
	failed := false
	loader.WithSamplesTill(ts, func(err error) {
		if err != nil {
			fmt.Fprintln(os.Stderr, "promqlcheck eval: samples:", oneLine(err))
			failed = true
		}
	})
	if failed {
		return 2
	}
	for _, expr := range in.Exprs {
		q, err := loader.QueryEngine().NewInstantQuery(loader.Context(), loader.Queryable(), nil, expr, ts)
		if err != nil {
			fmt.Println(oneLine(err))
			failed = true
			continue
		}
		res := q.Exec(loader.Context())
		q.Close()
		if res.Err != nil {
			fmt.Println(oneLine(res.Err))
			failed = true
			continue
		}
		switch v := res.Value.(type) {
		case promql.Vector:
			fmt.Println(len(v))
		case promql.Scalar:
			fmt.Println(1)
		default:
			fmt.Println("not an instant vector:", res.Value.Type())
			failed = true
		}
	}
	if failed {
		return 1
	}
	return 0
}

func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", " ")
}
