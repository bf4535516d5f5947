// promqlcheck parses PromQL expressions with Prometheus' own parser: one JSON array of strings on stdin, one
// line per expression on stdout ("ok" or the parse error). Used by tests/e2e/test_monitoring.py.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promqlcheck: stdin must be a JSON array of strings:", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	failed := false
	for _, expr := range exprs {
		if _, err := p.ParseExpr(expr); err != nil {
			fmt.Println(strings.ReplaceAll(err.Error(), "\n", " "))
			failed = true
			continue
		}
		fmt.Println("ok")
	}
	if failed {
		os.Exit(1)
	}
}
