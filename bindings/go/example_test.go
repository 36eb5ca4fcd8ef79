package rdzv_test

import (
	"context"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	rdzv "github.com/rdzv/rdzv/bindings/go"
)

// Two nodes of one job join a round and exchange a value through its store. Each node would
// be a process of its own (on its own machine) with the same URL; here they are goroutines.
// The URL names the tests' etcd; a job's would be
// "etcd://HOST:2379/job-42?min_nodes=2&max_nodes=2".
func ExampleRendezvous_Next() {
	url := rdzv.EtcdURLForExamples("job-42", "min_nodes=2&max_nodes=2&join_timeout=60")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	node := func() (string, error) {
		params, err := rdzv.ParamsFromURL(url)
		if err != nil {
			return "", err
		}
		defer params.Close()
		r, err := rdzv.NewRendezvous(params) // connects and registers this node
		if err != nil {
			return "", err
		}
		defer r.Close()                 // leaves, without closing the run for the others
		info, store, err := r.Next(ctx) // blocks until a round of 2 forms
		if err != nil {
			return "", err
		}
		defer store.Close()
		me := fmt.Sprintf("hello from rank %d", info.Rank)
		if err := store.Set(ctx, fmt.Sprintf("node/%d", info.Rank), []byte(me)); err != nil {
			return "", err
		}
		other := fmt.Sprintf("node/%d", (info.Rank+1)%info.WorldSize)
		peer, err := store.Get(ctx, other, rdzv.DefaultTimeout) // waits until it is set
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("rank %d of %d read %q", info.Rank, info.WorldSize, peer), nil
	}

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lines []string
	)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line, err := node()
			if err != nil {
				log.Fatal(err)
			}
			mu.Lock()
			lines = append(lines, line)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Strings(lines) // the ranks are given in the order the nodes joined
	for _, line := range lines {
		fmt.Println(line)
	}
	// Output:
	// rank 0 of 2 read "hello from rank 1"
	// rank 1 of 2 read "hello from rank 0"
}

// An operator's view of a run, without joining it.
func ExampleAdmin_Status() {
	params, err := rdzv.ParamsFromURL(rdzv.EtcdURLForExamples("job-43", ""))
	if err != nil {
		log.Fatal(err)
	}
	defer params.Close()
	admin, err := rdzv.NewAdmin(params)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status, err := admin.Status(ctx) // ends at once if ctx does, whatever etcd is doing
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exists:", status.Exists, "alive:", status.NumAlive)
	// Output: exists: false alive: 0
}
