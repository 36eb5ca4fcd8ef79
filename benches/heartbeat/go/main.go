// heartbeat.c's measurement through the Go binding (rdzv.Heartbeat, rdzv.HeartbeatStep,
// rdzv.SectionBegin and rdzv.SectionEnd); same arguments and output.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	rdzv "github.com/rdzv/rdzv/bindings/go"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: heartbeat-go REPS CALLS SECTION_CALLS")
		os.Exit(2)
	}
	var n [3]int
	for i := range n {
		v, err := strconv.Atoi(os.Args[i+1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		n[i] = v
	}
	reps, calls, sectionCalls := n[0], n[1], n[2]
	rdzv.Heartbeat()
	monitored := 0
	if rdzv.IsMonitored() {
		monitored = 1
	}
	fmt.Printf("monitored %d\nheartbeat", monitored)
	for r := 0; r < reps; r++ {
		start := time.Now()
		for i := 0; i < calls; i++ {
			rdzv.Heartbeat()
		}
		fmt.Printf(" %.3f", float64(time.Since(start).Nanoseconds())/float64(calls))
	}
	fmt.Print("\nstep")
	for r := 0; r < reps; r++ {
		start := time.Now()
		for i := 0; i < calls; i++ {
			if err := rdzv.HeartbeatStep(int64(i)); err != nil {
				panic(err)
			}
		}
		fmt.Printf(" %.3f", float64(time.Since(start).Nanoseconds())/float64(calls))
	}
	fmt.Print("\nsection")
	for r := 0; r < reps; r++ {
		start := time.Now()
		for i := 0; i < sectionCalls; i++ {
			if err := rdzv.SectionBegin("step"); err != nil {
				panic(err)
			}
			if err := rdzv.SectionEnd("step"); err != nil {
				panic(err)
			}
		}
		fmt.Printf(" %.3f", float64(time.Since(start).Nanoseconds())/float64(sectionCalls))
	}
	fmt.Println()
}
