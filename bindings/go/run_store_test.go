package rdzv

import (
	"errors"
	"testing"
	"time"
)

// The run's store outlives rounds: set in round 0, read in round 2, once round 0's own store
// is gone; a second handle on it adds to the same counter; it fails once the node shut down.
func TestRunStoreOutlivesRounds(t *testing.T) {
	r := mustRendezvous(t, runURL("run-store", 1, 30))
	run, err := r.RunStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	_, round0, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer round0.Close()
	if err := run.Set(ctx, "notes/why", []byte("set in round 0")); err != nil {
		t.Fatal(err)
	}
	if err := round0.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	if _, err := round0.Get(ctx, "k", 0); !errors.Is(err, ErrState) {
		t.Errorf("round 0's store two rounds later: %v", err)
	}
	again, err := r.RunStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if v, err := again.Get(ctx, "notes/why", 0); err != nil || string(v) != "set in round 0" {
		t.Errorf("the run's store in round 2: %q, %v", v, err)
	}
	for want := int64(1); want <= 2; want++ {
		if n, err := run.Add(ctx, "restarts", 1); err != nil || n != want {
			t.Errorf("Add = %d, %v; want %d", n, err, want)
		}
	}
	if n, err := again.Add(ctx, "restarts", 1); err != nil || n != 3 {
		t.Errorf("Add through another handle = %d, %v; want 3", n, err)
	}
	if err := r.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := run.Set(ctx, "after", []byte("1")); !errors.Is(err, ErrShutdown) {
		t.Errorf("Set after Shutdown: %v", err)
	}
	if _, err := r.RunStore(ctx); !errors.Is(err, ErrShutdown) {
		t.Errorf("RunStore after Shutdown: %v", err)
	}
}
