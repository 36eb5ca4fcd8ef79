// go-scheduler runs an elastic job of `rdzv run` launchers and changes it on a schedule, as a
// cluster scheduler would, watching the run through rdzv.Admin: it starts the job, adds a node
// (the members re-form with it), drains one (a planned scale-down: the others re-form at once,
// the drained launcher exits 0), adds another and SIGKILLs one (an unplanned loss: the others
// wait for its lease to expire), then closes and purges the run. It prints one line per event
// the watch showed and per action it took, with times, and for each removal how long the
// survivors took to form their next round. Usage:
//
//	go-scheduler -endpoint 127.0.0.1:2379 [-rdzv PATH] [-run ID] [-repeat N]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	cfg := Config{Out: os.Stdout}
	flag.StringVar(&cfg.Endpoint, "endpoint", "", "etcd HOST:PORT (required)")
	flag.StringVar(&cfg.RunID, "run", fmt.Sprintf("go-scheduler-%d", os.Getpid()), "the run id")
	flag.StringVar(&cfg.Rdzv, "rdzv", "rdzv", "the rdzv launcher binary")
	flag.IntVar(&cfg.Nodes, "nodes", 2, "launchers at the start (2 to 3: --nnodes is 2:4)")
	flag.IntVar(&cfg.Repeat, "repeat", 1, "drains and kills, each timed")
	flag.IntVar(&cfg.LeaseTTL, "lease-ttl", 3, "lease_ttl of the job, seconds")
	flag.IntVar(&cfg.LastCall, "last-call", 1, "last_call_timeout of the job, seconds")
	limit := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	if cfg.Endpoint == "" || cfg.Nodes < 2 || cfg.Nodes > 3 || cfg.Repeat < 1 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *limit)
	defer cancel()
	if _, err := Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "go-scheduler:", err)
		cancel()
		os.Exit(1)
	}
}
