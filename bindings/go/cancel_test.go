package rdzv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// prompt is what "ends at once" allows: about a second at most; the calls took 27-30 s here
// before waits raced every step against their cancel. Machines running many tests are slow.
const prompt = 3 * time.Second

// A context that ends just before the C call starts, made deterministic: the call's token is
// cancelled before the call. It must end at once (join_timeout is 60 s) and join nothing.
func TestTokenCancelledBeforeNextEndsItAtOnce(t *testing.T) {
	url := runURL("token-first", 2, 60)
	r := mustRendezvous(t, url)
	tok, err := newCancelToken()
	if err != nil {
		t.Fatal(err)
	}
	defer tok.free()
	tok.cancel()
	start := time.Now()
	_, _, err = r.nextWith(context.Background(), tok)
	if !errors.Is(err, ErrCancelled) {
		t.Fatalf("Next with a cancelled token: %v, want ErrCancelled", err)
	}
	if elapsed := time.Since(start); elapsed > prompt {
		t.Errorf("Next with a cancelled token took %v", elapsed)
	}
	// It joined nothing, and the handle is usable: a round of two forms now.
	again := make(chan nextOutcome, 2)
	for _, node := range []*Rendezvous{r, mustRendezvous(t, url)} {
		go func() {
			info, s, err := node.Next(ctxTimeout(t, 60*time.Second))
			again <- nextOutcome{info, s, err}
		}()
	}
	a, b := receive(t, again, 90*time.Second), receive(t, again, 90*time.Second)
	if a.err != nil || b.err != nil {
		t.Fatalf("round after the cancelled call: %v / %v", a.err, b.err)
	}
	a.store.Close()
	b.store.Close()
	if a.info.WorldSize != 2 || b.info.WorldSize != 2 {
		t.Errorf("rounds %+v and %+v", a.info, b.info)
	}
}

func TestTokenCancelledBeforeAStoreWaitEndsItAtOnce(t *testing.T) {
	s := singleStore(t)
	if err := s.Set(ctx, "here", []byte("v")); err != nil {
		t.Fatal(err)
	}
	tok, err := newCancelToken()
	if err != nil {
		t.Fatal(err)
	}
	defer tok.free()
	tok.cancel()
	start := time.Now()
	if _, err := s.multiGet(ctx, tok, []string{"here"}, time.Minute); !errors.Is(err, ErrCancelled) {
		t.Errorf("a wait with a cancelled token, for a key that exists: %v, want ErrCancelled", err)
	}
	if elapsed := time.Since(start); elapsed > prompt {
		t.Errorf("took %v", elapsed)
	}
	if v, err := s.Get(ctx, "here", time.Minute); err != nil || string(v) != "v" {
		t.Errorf("a wait with a token of its own: %q, %v", v, err)
	}
}

// records is a slog handler that lets a test wait for a library record (what a call does:
// its store wait watching, its reads failing) instead of sleeping.
type records struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{}
}

func newRecords() *records { return &records{changed: make(chan struct{})} }

func (k *records) Enabled(context.Context, slog.Level) bool { return true }
func (k *records) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lines = append(k.lines, line)
	close(k.changed)
	k.changed = make(chan struct{})
	return nil
}
func (k *records) WithAttrs([]slog.Attr) slog.Handler { return k }
func (k *records) WithGroup(string) slog.Handler      { return k }

func (k *records) mark() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.lines)
}

// await waits (at most 20 s) for a record after since that names run and contains what.
func (k *records) await(t *testing.T, since int, run, what string) {
	t.Helper()
	giveUp := time.After(20 * time.Second)
	for {
		k.mu.Lock()
		for _, l := range k.lines[since:] {
			if strings.Contains(l, run) && strings.Contains(l, what) {
				k.mu.Unlock()
				return
			}
		}
		changed := k.changed
		k.mu.Unlock()
		select {
		case <-changed:
		case <-giveUp:
			t.Fatalf("no record %q of run %s", what, run)
		}
	}
}

type fault string

const (
	killed fault = "SIGKILL"
	frozen fault = "SIGSTOP"
)

type trigger string

const (
	byContext  trigger = "the context"
	byClose    trigger = "Store.Close"
	byShutdown trigger = "the node's Shutdown"
	byDeadline trigger = "its 3 s timeout"
)

// storeGetUnder: a Get waits on a private etcd, etcd is broken under it, then trig fires.
// Returns how long after the trigger the Get returned, having checked how it ended.
func storeGetUnder(t *testing.T, f fault, trig trigger) time.Duration {
	// A private etcd, broken below.
	srv, err := startEtcd(100 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	kept := newRecords()
	SetLogger(slog.New(kept))
	defer SetLogger(nil)
	run := fmt.Sprintf("faults-%d", runSeq.Add(1))
	r := mustRendezvous(t, fmt.Sprintf("etcd://%s/%s?min_nodes=1&max_nodes=1&join_timeout=60&close_timeout=2", srv.endpoint, run))
	defer r.Close()
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	timeout := time.Minute
	if trig == byDeadline {
		timeout = 3 * time.Second
	}
	getCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		err error
		at  time.Time
	}
	done := make(chan outcome, 1)
	since := kept.mark()
	started := time.Now()
	go func() {
		_, err := s.Get(getCtx, "never", timeout)
		done <- outcome{err, time.Now()}
	}()
	kept.await(t, since, run, "store wait watching")
	since = kept.mark()
	if f == killed {
		if err := srv.kill(); err != nil {
			t.Fatal(err)
		}
		// Its watch broke, and its read finds etcd gone (a warning after a second of that).
		kept.await(t, since, run, "still retrying")
	} else {
		// Its read after the watch's set-up hangs.
		if err := srv.signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = srv.signal(syscall.SIGCONT) }()
	}
	fired := time.Now()
	switch trig {
	case byContext:
		cancel()
	case byClose:
		go s.Close()
	case byShutdown:
		go r.Shutdown() // blocks up to close_timeout while etcd is away
	case byDeadline:
		fired = started.Add(timeout)
	}
	var o outcome
	select {
	case o = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("Get under %s still waiting a minute after %s", f, trig)
	}
	late := o.at.Sub(fired)
	t.Logf("Get, etcd %s under it, %s: returned %.2f s after it (%v)", f, trig, late.Seconds(), o.err)
	var want []error
	switch trig {
	case byContext:
		want = []error{context.Canceled}
	case byClose:
		want = []error{ErrCancelled}
	case byShutdown:
		want = []error{ErrShutdown}
	case byDeadline:
		// A deadline that passes while etcd does not answer is reported as etcd's failure.
		want = []error{ErrTimeout, ErrConnection}
	}
	matched := false
	for _, w := range want {
		matched = matched || errors.Is(o.err, w)
	}
	if !matched {
		t.Errorf("Get under %s, %s: %v, want one of %v", f, trig, o.err, want)
	}
	return late
}

func storeGetEndsPromptlyUnder(t *testing.T, f fault) {
	for _, trig := range []trigger{byContext, byClose, byShutdown, byDeadline} {
		if late := storeGetUnder(t, f, trig); late > prompt {
			t.Errorf("Get under %s returned %v after %s", f, late, trig)
		}
	}
}

func TestStoreGetEndsPromptlyWhenEtcdIsKilled(t *testing.T) {
	storeGetEndsPromptlyUnder(t, killed)
}

func TestStoreGetEndsPromptlyWhenEtcdIsFrozen(t *testing.T) {
	storeGetEndsPromptlyUnder(t, frozen)
}

// TestCallsEndWithTheirContext: the calls that do not wait for other nodes (reads, writes,
// drain, the admin's) return as soon as their context ends, with an error matching
// ErrCancelled and ctx.Err(): at once when it ended before the call, without taking effect;
// and when etcd stops answering under them (frozen with SIGSTOP), at their deadline rather
// than after connect_timeout (30 s). The C call has ended then too (its cancel token ended
// it): nothing goes on in the background, so closing the handles, which waits for the calls
// in flight, does not wait for etcd.
func TestCallsEndWithTheirContext(t *testing.T) {
	srv, err := startEtcd(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	run := fmt.Sprintf("ctx-calls-%d", runSeq.Add(1))
	r := mustRendezvous(t, fmt.Sprintf("etcd://%s/%s?min_nodes=1&max_nodes=1&join_timeout=60&connect_timeout=30&close_timeout=2", srv.endpoint, run))
	defer r.Close()
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := ParamsFromURL(fmt.Sprintf("etcd://%s/%s?connect_timeout=30&close_timeout=2", srv.endpoint, run))
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAdmin(p)
	p.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	type namedCall struct {
		name string
		call func(context.Context) error
	}
	calls := []namedCall{
		{"IsClosed", func(c context.Context) error { _, err := r.IsClosed(c); return err }},
		{"NumWaiting", func(c context.Context) error { _, err := r.NumWaiting(c); return err }},
		{"NumLost", func(c context.Context) error { _, err := r.NumLost(c); return err }},
		{"IsDraining", func(c context.Context) error { _, err := r.IsDraining(c); return err }},
		{"Store.Check", func(c context.Context) error { _, err := s.Check(c, []string{"k"}); return err }},
		{"Store.NumKeys", func(c context.Context) error { _, err := s.NumKeys(c); return err }},
		{"Store.Set", func(c context.Context) error { return s.Set(c, "k", []byte("v")) }},
		{"Store.Add", func(c context.Context) error { _, err := s.Add(c, "n", 1); return err }},
		{"Store.CompareSet", func(c context.Context) error { _, err := s.CompareSet(c, "k", nil, []byte("v")); return err }},
		{"Store.DeleteKey", func(c context.Context) error { _, err := s.DeleteKey(c, "k"); return err }},
		{"Store.MultiSet", func(c context.Context) error { return s.MultiSet(c, []string{"k"}, [][]byte{[]byte("v")}) }},
		{"SetClosed", func(c context.Context) error { return r.SetClosed(c) }},
		{"Drain", func(c context.Context) error { return r.Drain(c, "ctx test") }},
		{"Admin.Status", func(c context.Context) error { _, err := a.Status(c); return err }},
		{"Admin.CloseRun", func(c context.Context) error { return a.CloseRun(c) }},
		{"Admin.Purge", func(c context.Context) error { _, err := a.Purge(c, true); return err }},
		{"Admin.Drain", func(c context.Context) error { return a.Drain(c, r.NodeID(), "ctx test") }},
	}

	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range calls {
		if err := c.call(done); !errors.Is(err, ErrCancelled) || !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want ErrCancelled and context.Canceled", c.name, err)
		}
	}
	// Nothing was written.
	if closed, err := r.IsClosed(ctx); err != nil || closed {
		t.Errorf("after SetClosed with a cancelled context: IsClosed = %v, %v", closed, err)
	}
	if draining, err := r.IsDraining(ctx); err != nil || draining {
		t.Errorf("after Drain with a cancelled context: IsDraining = %v, %v", draining, err)
	}
	if n, err := s.NumKeys(ctx); err != nil || n != 0 {
		t.Errorf("after store writes with a cancelled context: NumKeys = %d, %v", n, err)
	}

	// IsClosed, NumWaiting and NumLost answer from the node's membership watch once it is in
	// sync (the calls above started it): then they send etcd nothing, and a frozen etcd does
	// not hold them (nothing can change while it is frozen); before, they read and end with
	// their deadline like the rest. Either way, never later.
	watched := map[string]bool{"IsClosed": true, "NumWaiting": true, "NumLost": true}
	// Every other call sends etcd a request, which a frozen etcd never answers.
	if err := srv.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.signal(syscall.SIGCONT) }()
	const deadline = 300 * time.Millisecond
	for _, c := range calls {
		cctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := c.call(cctx)
		took := time.Since(start)
		cancel()
		t.Logf("%s, etcd frozen, %v deadline: returned after %.2f s (%v)", c.name, deadline, took.Seconds(), err)
		ended := errors.Is(err, ErrCancelled) && errors.Is(err, context.DeadlineExceeded)
		switch {
		case watched[c.name] && err != nil && !ended:
			t.Errorf("%s with etcd frozen: %v, want an answer from the watch or its deadline", c.name, err)
		case !watched[c.name] && !ended:
			t.Errorf("%s with etcd frozen: %v, want ErrCancelled and context.DeadlineExceeded", c.name, err)
		}
		if took > deadline+prompt {
			t.Errorf("%s with etcd frozen returned %v after its %v deadline", c.name, took-deadline, deadline)
		}
	}
	// No call went on in the background (each held its handle until connect_timeout before).
	start := time.Now()
	s.Close()
	a.Close()
	if took := time.Since(start); took > prompt {
		t.Errorf("closing the store and the admin handle took %v: calls were still running", took)
	}
	start = time.Now()
	r.Close() // shuts the node down first: at most close_timeout (2 s) while etcd is frozen
	if took := time.Since(start); took > 2*time.Second+prompt {
		t.Errorf("closing the node took %v: calls were still running", took)
	}
}

// A handle's Cancel made before another goroutine starts the call ends that call (the
// library keeps it), once: the call after it runs normally.
func TestCancelMadeBeforeTheCallEndsIt(t *testing.T) {
	url := runURL("cancel-first", 2, 60)
	r := mustRendezvous(t, url)
	if err := r.Cancel(); err != nil {
		t.Fatal(err)
	}
	next := make(chan nextOutcome, 1)
	start := time.Now()
	go func() {
		info, s, err := r.Next(ctxTimeout(t, 60*time.Second))
		next <- nextOutcome{info, s, err}
	}()
	if o := receive(t, next, 10*time.Second); !errors.Is(o.err, ErrCancelled) {
		t.Fatalf("Next after Cancel: %v, want ErrCancelled", o.err)
	}
	if elapsed := time.Since(start); elapsed > prompt {
		t.Errorf("Next after Cancel took %v", elapsed)
	}
	// Used up: the handle joins a round of two now.
	again := make(chan nextOutcome, 2)
	for _, node := range []*Rendezvous{r, mustRendezvous(t, url)} {
		go func() {
			info, s, err := node.Next(ctxTimeout(t, 60*time.Second))
			again <- nextOutcome{info, s, err}
		}()
	}
	for range 2 {
		o := receive(t, again, 90*time.Second)
		if o.err != nil {
			t.Fatalf("Next after the cancelled one: %v", o.err)
		}
		o.store.Close()
	}

	s := singleStore(t)
	if err := s.Set(ctx, "here", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, "here", time.Minute)
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, ErrCancelled) {
			t.Errorf("Get after Store.Cancel: %v, want ErrCancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get after Store.Cancel still waiting")
	}
	if v, err := s.Get(ctx, "here", time.Minute); err != nil || string(v) != "v" {
		t.Errorf("Get after the cancelled one: %q, %v", v, err)
	}
}
