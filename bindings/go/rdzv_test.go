package rdzv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every blocking call here is bounded: URLs carry a join_timeout, Next gets a context with a
// deadline, store reads carry a timeout and channel receives are raced against a timer.

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

type nextOutcome struct {
	info  RoundInfo
	store *Store
	err   error
}

// startNext runs Next(ctx) in a goroutine and checks it is still blocked a moment later (the
// run needs more nodes than there are).
func startNext(t *testing.T, r *Rendezvous, ctx context.Context) <-chan nextOutcome {
	t.Helper()
	ch := make(chan nextOutcome, 1)
	go func() {
		info, store, err := r.Next(ctx)
		ch <- nextOutcome{info, store, err}
	}()
	select {
	case o := <-ch:
		t.Fatalf("Next returned early: %+v", o)
	case <-time.After(300 * time.Millisecond):
	}
	return ch
}

func receive(t *testing.T, ch <-chan nextOutcome, limit time.Duration) nextOutcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(limit):
		t.Fatalf("Next did not return within %v", limit)
		return nextOutcome{}
	}
}

func TestNodesFormRoundAndExchangeThroughStore(t *testing.T) {
	const n = 3
	url := runURL("round", n, 60)
	type result struct {
		info   RoundInfo
		nodeID string
		peers  [][]byte
		added  int64
		err    error
	}
	results := make(chan result, n)
	for i := 0; i < n; i++ {
		go func() {
			res := result{}
			defer func() { results <- res }()
			p, err := ParamsFromURL(url)
			if err != nil {
				res.err = err
				return
			}
			defer p.Close()
			r, err := NewRendezvous(p)
			if err != nil {
				res.err = err
				return
			}
			defer r.Close()
			res.nodeID = r.NodeID()
			info, store, err := r.Next(ctxTimeout(t, 60*time.Second))
			if err != nil {
				res.err = err
				return
			}
			defer store.Close()
			res.info = info
			if res.err = store.Set(ctx, fmt.Sprintf("node/%d", info.Rank), []byte(r.NodeID())); res.err != nil {
				return
			}
			keys := make([]string, info.WorldSize)
			for k := range keys {
				keys[k] = fmt.Sprintf("node/%d", k)
			}
			if res.peers, res.err = store.MultiGet(ctx, keys, 30*time.Second); res.err != nil {
				return
			}
			res.added, res.err = store.Add(ctx, "arrived", 1)
		}()
	}
	var all []result
	for i := 0; i < n; i++ {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("node failed: %v", r.err)
			}
			all = append(all, r)
		case <-time.After(90 * time.Second):
			t.Fatal("nodes did not finish in time")
		}
	}
	var ranks, added []int
	for _, r := range all {
		ranks = append(ranks, int(r.info.Rank))
		added = append(added, int(r.added))
		if r.info.WorldSize != n || r.info.Round != all[0].info.Round {
			t.Errorf("round %+v differs from %+v", r.info, all[0].info)
		}
		if r.info.MasterAddr == "" || r.info.MasterPort == 0 ||
			r.info.MasterAddr != all[0].info.MasterAddr || r.info.MasterPort != all[0].info.MasterPort {
			t.Errorf("master %s:%d vs %s:%d", r.info.MasterAddr, r.info.MasterPort, all[0].info.MasterAddr, all[0].info.MasterPort)
		}
		if len(r.peers) != n || string(r.peers[r.info.Rank]) != r.nodeID {
			t.Errorf("rank %d read %q, want its own id %s at its rank", r.info.Rank, r.peers, r.nodeID)
		}
		for k := range r.peers {
			if !bytes.Equal(r.peers[k], all[0].peers[k]) {
				t.Errorf("nodes read different values: %q vs %q", r.peers, all[0].peers)
			}
		}
	}
	sort.Ints(ranks)
	sort.Ints(added)
	if fmt.Sprint(ranks) != "[0 1 2]" {
		t.Errorf("ranks %v, want [0 1 2]", ranks)
	}
	if fmt.Sprint(added) != "[1 2 3]" {
		t.Errorf("Add results %v, want [1 2 3]", added)
	}
}

func TestNextCancelledByContextThenUsableAgain(t *testing.T) {
	url := runURL("cancel", 2, 60)
	r := mustRendezvous(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := startNext(t, r, ctx)
	start := time.Now()
	cancel()
	o := receive(t, ch, 10*time.Second)
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("cancelled Next took %v", elapsed)
	}
	if !errors.Is(o.err, context.Canceled) || !errors.Is(o.err, ErrCancelled) {
		t.Fatalf("err = %v, want context.Canceled and ErrCancelled", o.err)
	}
	var rerr *Error
	if !errors.As(o.err, &rerr) || rerr.Status != StatusCancelled {
		t.Errorf("errors.As *Error: %v", o.err)
	}

	// The handle is usable again: it forms a round with a second node.
	again := make(chan nextOutcome, 2)
	go func() {
		info, s, err := r.Next(ctxTimeout(t, 60*time.Second))
		again <- nextOutcome{info, s, err}
	}()
	go func() {
		other := mustRendezvous(t, url)
		info, s, err := other.Next(ctxTimeout(t, 60*time.Second))
		again <- nextOutcome{info, s, err}
	}()
	a, b := receive(t, again, 90*time.Second), receive(t, again, 90*time.Second)
	if a.err != nil || b.err != nil {
		t.Fatalf("round after cancel: %v / %v", a.err, b.err)
	}
	defer a.store.Close()
	defer b.store.Close()
	if a.info.WorldSize != 2 || a.info.Rank == b.info.Rank {
		t.Errorf("rounds %+v and %+v", a.info, b.info)
	}
}

func TestNextContextDeadline(t *testing.T) {
	r := mustRendezvous(t, runURL("deadline", 2, 60))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := r.Next(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrCancelled) {
		t.Fatalf("err = %v, want context.DeadlineExceeded and ErrCancelled", err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("Next with a 500ms deadline took %v", elapsed)
	}
	// An already-done context does not even start.
	if _, _, err := r.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next on an expired context: %v", err)
	}
}

func TestNextJoinTimeout(t *testing.T) {
	r := mustRendezvous(t, runURL("jointimeout", 2, 1))
	_, _, err := r.Next(ctxTimeout(t, 30*time.Second))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
}

func TestSetClosedWakesNext(t *testing.T) {
	url := runURL("closed", 2, 60)
	waiter, closer := mustRendezvous(t, url), mustRendezvous(t, url)
	if closed, err := closer.IsClosed(ctx); err != nil || closed {
		t.Fatalf("IsClosed = %v, %v before closing", closed, err)
	}
	ch := startNext(t, waiter, ctxTimeout(t, 60*time.Second))
	if err := closer.SetClosed(ctx); err != nil {
		t.Fatal(err)
	}
	// join_timeout is 60 s: ErrClosed well before shows Next was woken.
	if o := receive(t, ch, 20*time.Second); !errors.Is(o.err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", o.err)
	}
	if closed, err := waiter.IsClosed(ctx); err != nil || !closed {
		t.Errorf("IsClosed = %v, %v after closing", closed, err)
	}
	if _, _, err := closer.Next(ctxTimeout(t, 30*time.Second)); !errors.Is(err, ErrClosed) {
		t.Errorf("Next on a closed run: %v", err)
	}
}

func TestShutdownAndCloseWakeNext(t *testing.T) {
	url := runURL("shutdown", 2, 60)
	r := mustRendezvous(t, url)
	ch := startNext(t, r, ctxTimeout(t, 60*time.Second))
	if err := r.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if o := receive(t, ch, 20*time.Second); !errors.Is(o.err, ErrShutdown) {
		t.Fatalf("err = %v, want ErrShutdown", o.err)
	}
	if _, _, err := r.Next(ctxTimeout(t, 30*time.Second)); !errors.Is(err, ErrShutdown) {
		t.Errorf("Next after Shutdown: %v", err)
	}

	// Close from another goroutine wakes a blocked Next too, and waits for it.
	r2 := mustRendezvous(t, url)
	ch2 := startNext(t, r2, ctxTimeout(t, 60*time.Second))
	closed := make(chan error, 1)
	go func() { closed <- r2.Close() }()
	if o := receive(t, ch2, 20*time.Second); o.err == nil {
		t.Fatal("Next succeeded alone in a 2-node run")
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return")
	}
}

func TestBadParams(t *testing.T) {
	for _, url := range []string{"", "http://127.0.0.1:2379/run", "etcd://127.0.0.1:2379/run?min_nodes=x"} {
		if _, err := ParamsFromURL(url); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParamsFromURL(%q) = %v, want ErrInvalidArgument", url, err)
		}
	}
	if _, err := NewParams("etcd-v3", "127.0.0.1:2379", "run", 3, 2); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("min > max: %v", err)
	}
	if _, err := NewParams("etcd-v3", "127.0.0.1:2379", "", 1, 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty run id: %v", err)
	}
	p, err := NewParams("etcd-v3", "127.0.0.1:2379", "run", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Set("no_such_option", "1")
	var rerr *Error
	if !errors.Is(err, ErrInvalidArgument) || !errors.As(err, &rerr) ||
		rerr.Status != StatusInvalidArgument || !strings.Contains(rerr.Message, "no_such_option") {
		t.Errorf("Set(unknown) = %#v", err)
	}
	if errors.Is(err, ErrTimeout) {
		t.Error("an invalid-argument error matches ErrTimeout")
	}
	if err := p.Set("join_timeout", "30"); err != nil {
		t.Errorf("Set(join_timeout): %v", err)
	}
	if _, err := NewRendezvous(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewRendezvous(nil): %v", err)
	}
}

func TestUnreachableEtcdIsConnectionError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p, err := ParamsFromURL(fmt.Sprintf("etcd://127.0.0.1:%d/nobody?connect_timeout=1", port))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := NewRendezvous(p); !errors.Is(err, ErrConnection) {
		t.Fatalf("err = %v, want ErrConnection", err)
	}
}

func TestAccessors(t *testing.T) {
	url := runURL("accessors", 1, 30)
	r := mustRendezvous(t, url)
	runID := url[strings.LastIndex(url, "/")+1 : strings.Index(url, "?")]
	if r.RunID() != runID || r.Backend() != "etcd-v3" {
		t.Errorf("RunID %q Backend %q", r.RunID(), r.Backend())
	}
	// 16 hex digits, unique per handle, as rdzv.h says.
	if id := r.NodeID(); len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
		t.Errorf("NodeID %q is not 16 hex digits", id)
	}
	if other := mustRendezvous(t, url); other.NodeID() == r.NodeID() {
		t.Errorf("two handles share NodeID %q", r.NodeID())
	}
	if n, err := r.NumWaiting(ctx); err != nil || n != 0 {
		t.Errorf("NumWaiting = %d, %v", n, err)
	}
	info, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if info.Rank != 0 || info.WorldSize != 1 {
		t.Errorf("info %+v", info)
	}
	if n, err := r.NumLost(ctx); err != nil || n != 0 {
		t.Errorf("NumLost = %d, %v", n, err)
	}
}

// singleStore is the store of a one-node round; its node stays until the test ends.
func singleStore(t *testing.T) *Store {
	t.Helper()
	r := mustRendezvous(t, runURL("store", 1, 30))
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); r.Close() })
	return s
}

// ctx is the context of store calls that are not about cancellation.
var ctx = context.Background()

func TestStoreSemantics(t *testing.T) {
	s := singleStore(t)
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	check("Set", s.Set(ctx, "greeting", []byte("hello")))
	v, err := s.Get(ctx, "greeting", 5*time.Second)
	check("Get", err)
	if string(v) != "hello" {
		t.Errorf("Get = %q", v)
	}
	bin := []byte{0, 1, 2, 0, 255}
	check("Set binary", s.Set(ctx, "binary", bin))
	if v, err := s.Get(ctx, "binary", DefaultTimeout); err != nil || !bytes.Equal(v, bin) {
		t.Errorf("Get binary = %v, %v", v, err)
	}
	check("Set empty", s.Set(ctx, "empty", nil))
	if v, err := s.Get(ctx, "empty", time.Second); err != nil || len(v) != 0 {
		t.Errorf("Get empty = %v, %v", v, err)
	}

	if _, err := s.Get(ctx, "missing", 0); !errors.Is(err, ErrTimeout) {
		t.Errorf("Get missing, no wait: %v", err)
	}
	if _, err := s.Get(ctx, "missing", 200*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Errorf("Get missing: %v", err)
	}
	if err := s.Wait(ctx, []string{"greeting", "missing"}, 200*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Errorf("Wait missing: %v", err)
	}
	check("Wait", s.Wait(ctx, []string{"greeting", "binary"}, 5*time.Second))
	if ok, err := s.Check(ctx, []string{"greeting", "binary"}); err != nil || !ok {
		t.Errorf("Check present = %v, %v", ok, err)
	}
	if ok, err := s.Check(ctx, []string{"greeting", "missing"}); err != nil || ok {
		t.Errorf("Check missing = %v, %v", ok, err)
	}

	if n, err := s.Add(ctx, "counter", 5); err != nil || n != 5 {
		t.Errorf("Add = %d, %v", n, err)
	}
	if n, err := s.Add(ctx, "counter", -2); err != nil || n != 3 {
		t.Errorf("Add = %d, %v", n, err)
	}
	if _, err := s.Add(ctx, "greeting", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Add on text: %v", err)
	}

	for _, c := range []struct{ expected, desired, want string }{
		{"", "one", "one"},      // absent + empty expected: set
		{"wrong", "two", "one"}, // mismatch: unchanged
		{"one", "two", "two"},   // match: swapped
	} {
		if v, err := s.CompareSet(ctx, "cas", []byte(c.expected), []byte(c.desired)); err != nil || string(v) != c.want {
			t.Errorf("CompareSet(%q, %q) = %q, %v; want %q", c.expected, c.desired, v, err, c.want)
		}
	}
	if v, err := s.CompareSet(ctx, "absent", []byte("x"), []byte("y")); err != nil || string(v) != "x" {
		t.Errorf("CompareSet on absent key = %q, %v", v, err)
	}

	check("MultiSet", s.MultiSet(ctx, []string{"m/a", "m/b", "m/empty"}, [][]byte{[]byte("A"), []byte("B"), nil}))
	vals, err := s.MultiGet(ctx, []string{"m/b", "m/a", "m/empty"}, 5*time.Second)
	check("MultiGet", err)
	if len(vals) != 3 || string(vals[0]) != "B" || string(vals[1]) != "A" || len(vals[2]) != 0 {
		t.Errorf("MultiGet = %q", vals)
	}
	if _, err := s.MultiGet(ctx, []string{"m/a", "missing"}, 200*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Errorf("MultiGet missing: %v", err)
	}
	if err := s.MultiSet(ctx, []string{"x", "y"}, [][]byte{nil}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("MultiSet length mismatch: %v", err)
	}

	before, err := s.NumKeys(ctx)
	check("NumKeys", err)
	if d, err := s.DeleteKey(ctx, "greeting"); err != nil || !d {
		t.Errorf("DeleteKey = %v, %v", d, err)
	}
	if d, err := s.DeleteKey(ctx, "greeting"); err != nil || d {
		t.Errorf("DeleteKey again = %v, %v", d, err)
	}
	if after, err := s.NumKeys(ctx); err != nil || after != before-1 {
		t.Errorf("NumKeys %d -> %d, %v", before, after, err)
	}

	if err := s.Set(ctx, "", []byte("v")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty key: %v", err)
	}
	if err := s.Set(ctx, strings.Repeat("k", 4097), nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("long key: %v", err)
	}

	// The store default applies to DefaultTimeout.
	check("SetTimeout", s.SetTimeout(200*time.Millisecond))
	start := time.Now()
	if _, err := s.Get(ctx, "missing", DefaultTimeout); !errors.Is(err, ErrTimeout) {
		t.Errorf("Get with store default: %v", err)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("store default not applied")
	}
}

func TestStoreGetWaitsForConcurrentSet(t *testing.T) {
	s := singleStore(t)
	got := make(chan []byte, 1)
	go func() {
		v, err := s.Get(ctx, "late", 30*time.Second)
		if err != nil {
			v = []byte("error: " + err.Error())
		}
		got <- v
	}()
	select {
	case v := <-got:
		t.Fatalf("Get returned before Set: %q", v)
	case <-time.After(200 * time.Millisecond):
	}
	if err := s.Set(ctx, "late", []byte("arrived")); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if string(v) != "arrived" {
			t.Errorf("Get = %q", v)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Get did not return")
	}
}

func TestStoreConcurrentAdd(t *testing.T) {
	s := singleStore(t)
	const workers, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if _, err := s.Add(ctx, "n", 1); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, err := s.Add(ctx, "n", 0); err != nil || n != workers*each {
		t.Errorf("sum = %d, %v", n, err)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	p, err := ParamsFromURL(runURL("close", 1, 30))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRendezvous(p)
	if err != nil {
		t.Fatal(err)
	}
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := p.Close(); err != nil {
			t.Errorf("Params.Close #%d: %v", i, err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("Rendezvous.Close #%d: %v", i, err)
		}
	}
	// The store's calls fail once its node is closed; the store closes idempotently too.
	if err := s.Set(ctx, "after", []byte("close")); !errors.Is(err, ErrShutdown) {
		t.Errorf("store after Rendezvous.Close: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := s.Close(); err != nil {
			t.Errorf("Store.Close #%d: %v", i, err)
		}
	}
	// Calls on closed handles fail with ErrShutdown, as in every binding.
	if err := p.Set("min_nodes", "1"); !errors.Is(err, ErrShutdown) {
		t.Errorf("Params.Set after Close: %v", err)
	}
	if _, err := NewRendezvous(p); !errors.Is(err, ErrShutdown) {
		t.Errorf("NewRendezvous(closed params): %v", err)
	}
	if _, _, err := r.Next(ctxTimeout(t, 5*time.Second)); !errors.Is(err, ErrShutdown) {
		t.Errorf("Next after Close: %v", err)
	}
	if _, err := s.Get(ctx, "after", 0); !errors.Is(err, ErrShutdown) {
		t.Errorf("Store.Get after Close: %v", err)
	}
	if r.NodeID() == "" {
		t.Error("NodeID empty after Close")
	}
}

// A Get blocked on a key nobody sets ends when its context does, when the store is closed
// (without Close waiting out the timeout), and when its node is closed.
func TestStoreWaitsEndWithContextCloseAndNodeClose(t *testing.T) {
	r := mustRendezvous(t, runURL("store-ctx", 1, 30))
	defer r.Close()
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Get(cctx, "never", DefaultTimeout); !errors.Is(err, ErrCancelled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get with a context deadline: %v", err)
	}
	if _, err := s.Get(ctx, "after-ctx", 0); !errors.Is(err, ErrTimeout) {
		t.Errorf("the store is usable after a cancelled wait: %v", err)
	}

	got := make(chan error, 1)
	go func() { _, err := s.Get(ctx, "never", DefaultTimeout); got <- err }()
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Store.Close waited for a blocked Get")
	}
	if err := <-got; !errors.Is(err, ErrCancelled) && !errors.Is(err, ErrShutdown) {
		t.Errorf("Get woken by Close: %v", err)
	}

	r2 := mustRendezvous(t, runURL("store-node-close", 1, 30))
	_, s2, err := r2.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	go func() { _, err := s2.Get(ctx, "never", DefaultTimeout); got <- err }()
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, ErrShutdown) {
			t.Errorf("Get after its node closed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a Get outlived its node")
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
}

func TestStatusNames(t *testing.T) {
	if StatusTimeout.String() != "RDZV_ERR_TIMEOUT" || Status(99).String() != "RDZV_ERR_UNKNOWN" {
		t.Errorf("names: %s %s", StatusTimeout, Status(99))
	}
	for st, sentinel := range sentinels {
		err := error(&Error{Status: st, Message: "m"})
		if !errors.Is(err, sentinel) {
			t.Errorf("%s does not match its sentinel", st)
		}
		for other, s2 := range sentinels {
			if other != st && errors.Is(err, s2) {
				t.Errorf("%s matches %s's sentinel", st, other)
			}
		}
	}
}

func TestVersion(t *testing.T) {
	if v := Version(); len(strings.Split(v, ".")) != 3 {
		t.Errorf("Version() = %q, want MAJOR.MINOR.PATCH", v)
	}
}

// keepRecords is a slog handler that keeps every record.
type keepRecords struct {
	mu      sync.Mutex
	records []slog.Record
}

func (k *keepRecords) Enabled(context.Context, slog.Level) bool { return true }
func (k *keepRecords) Handle(_ context.Context, r slog.Record) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.records = append(k.records, r)
	return nil
}
func (k *keepRecords) WithAttrs([]slog.Attr) slog.Handler { return k }
func (k *keepRecords) WithGroup(string) slog.Handler      { return k }

func TestLogRecordsReachSlog(t *testing.T) {
	kept := &keepRecords{}
	SetLogger(slog.New(kept))
	defer SetLogger(nil)
	url := runURL("logs", 1, 30)
	r := mustRendezvous(t, url)
	node := r.NodeID()
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	r.Close()
	SetLogger(nil) // no more records into kept
	kept.mu.Lock()
	defer kept.mu.Unlock()
	var complete []map[string]slog.Value
	for _, rec := range kept.records {
		attrs := map[string]slog.Value{}
		rec.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value
			return true
		})
		if rec.Message == "round complete" && attrs["node"].String() == node {
			if rec.Level != slog.LevelInfo {
				t.Errorf("round complete at %v", rec.Level)
			}
			complete = append(complete, attrs)
		}
	}
	if len(complete) != 1 {
		t.Fatalf("%d 'round complete' records for node %s among %d records", len(complete), node, len(kept.records))
	}
	attrs := complete[0]
	if attrs["target"].String() != "rdzv::rendezvous" || !strings.Contains(url, "/"+attrs["run"].String()+"?") {
		t.Errorf("target %v, run %v (url %s)", attrs["target"], attrs["run"], url)
	}
	if attrs["round"].Kind() != slog.KindInt64 || attrs["round"].Int64() != 0 || attrs["world_size"].Int64() != 1 {
		t.Errorf("round %v, world_size %v", attrs["round"], attrs["world_size"])
	}
}

// panicky is a slog handler that panics on every record.
type panicky struct{ calls atomic.Int64 }

func (p *panicky) Enabled(context.Context, slog.Level) bool { return true }
func (p *panicky) Handle(context.Context, slog.Record) error {
	p.calls.Add(1)
	panic("a broken log handler")
}
func (p *panicky) WithAttrs([]slog.Attr) slog.Handler { return p }
func (p *panicky) WithGroup(string) slog.Handler      { return p }

func TestPanickingLogHandlerLosesRecordsNotTheProcess(t *testing.T) {
	h := &panicky{}
	SetLogger(slog.New(h))
	defer SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	r := mustRendezvous(t, runURL("logpanic", 1, 30))
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	r.Close()
	if h.calls.Load() == 0 {
		t.Error("the handler was never called")
	}
}

func TestSplitLine(t *testing.T) {
	msg, attrs := splitLine(`etcd keeps failing; still retrying run=job-7 round=3 what="store set" error="a \"quoted\" word" ok=true`)
	if msg != "etcd keeps failing; still retrying" {
		t.Errorf("message %q", msg)
	}
	want := []slog.Attr{slog.String("run", "job-7"), slog.Int64("round", 3), slog.String("what", "store set"),
		slog.String("error", `a "quoted" word`), slog.Bool("ok", true)}
	if len(attrs) != len(want) {
		t.Fatalf("attrs %v", attrs)
	}
	for i := range want {
		if !attrs[i].Equal(want[i]) {
			t.Errorf("attr %d: %v, want %v", i, attrs[i], want[i])
		}
	}
	if msg, attrs := splitLine("no fields here"); msg != "no fields here" || len(attrs) != 0 {
		t.Errorf("%q %v", msg, attrs)
	}
}
