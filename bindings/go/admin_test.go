package rdzv

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// Every blocking call here is bounded, as in rdzv_test.go: statuses from a Watch are
// received against a timer, Next gets a context with a deadline, runs carry a join_timeout.

func mustAdmin(t *testing.T, url string) *Admin {
	t.Helper()
	p, err := ParamsFromURL(url)
	if err != nil {
		t.Fatalf("ParamsFromURL(%q): %v", url, err)
	}
	defer p.Close()
	a, err := NewAdmin(p)
	if err != nil {
		t.Fatalf("NewAdmin: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// formRound starts n nodes on url, each in its own goroutine, and returns them in rank order
// once they completed a round together.
func formRound(t *testing.T, url string, n int) []*Rendezvous {
	t.Helper()
	type joined struct {
		r    *Rendezvous
		rank uint32
		err  error
	}
	ch := make(chan joined, n)
	for i := 0; i < n; i++ {
		r := mustRendezvous(t, url)
		go func() {
			info, store, err := r.Next(ctxTimeout(t, 60*time.Second))
			if err == nil {
				store.Close()
			}
			ch <- joined{r, info.Rank, err}
		}()
	}
	nodes := make([]*Rendezvous, n)
	for i := 0; i < n; i++ {
		select {
		case j := <-ch:
			if j.err != nil {
				t.Fatalf("Next: %v", j.err)
			}
			nodes[j.rank] = j.r
		case <-time.After(90 * time.Second):
			t.Fatalf("%d nodes did not form a round", n)
		}
	}
	return nodes
}

// watchUntil reads statuses until one satisfies want, failing after limit or if the watch
// ends; it returns every status read, the matching one last.
func watchUntil(t *testing.T, statuses <-chan *RunStatus, errs <-chan error, limit time.Duration,
	what string, want func(*RunStatus) bool) []*RunStatus {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var seen []*RunStatus
	for {
		select {
		case s, ok := <-statuses:
			if !ok {
				t.Fatalf("watch ended before %s: %v", what, <-errs)
			}
			seen = append(seen, s)
			if want(s) {
				return seen
			}
		case <-timer.C:
			t.Fatalf("no status with %s within %v; saw %s", what, limit, describe(seen))
		}
	}
}

func describe(statuses []*RunStatus) string {
	var parts []string
	for _, s := range statuses {
		line := fmt.Sprintf("%+v", *s)
		if s.Sealed != nil {
			line += fmt.Sprintf(" sealed %+v", *s.Sealed)
		}
		parts = append(parts, line)
	}
	return strings.Join(parts, "\n")
}

func nodeIDs(nodes []*Rendezvous) []string {
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.NodeID())
	}
	return ids
}

func memberIDs(s *RunStatus) []string {
	var ids []string
	for _, m := range s.Members() {
		ids = append(ids, m.NodeID)
	}
	return ids
}

func TestAdminStatusOfAbsentRun(t *testing.T) {
	url := runURL("absent", 1, 30)
	a := mustAdmin(t, url)
	s, err := a.Status(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatalf("Status of a run that never started: %v", err)
	}
	runID := url[strings.LastIndex(url, "/")+1 : strings.Index(url, "?")]
	if s.RunID != runID || s.Exists || s.Closed || s.Sealed != nil || len(s.Waiting) != 0 || s.NumAlive != 0 {
		t.Errorf("status of an absent run: %+v", *s)
	}
	if s.Revision <= 0 {
		t.Errorf("revision %d, want etcd's (> 0)", s.Revision)
	}
}

func TestAdminStatusListsMembersInRankOrder(t *testing.T) {
	url := runURL("members", 2, 60)
	nodes := formRound(t, url, 2)
	a := mustAdmin(t, url)
	s, err := a.Status(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Exists || s.Sealed == nil || s.Sealed.Round != 0 || s.NumAlive != 2 || s.NumLost != 0 {
		t.Fatalf("status after round 0: %+v", *s)
	}
	if got, want := memberIDs(s), nodeIDs(nodes); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("members %v, want %v (rank order)", got, want)
	}
	for i, m := range s.Members() {
		if m.Rank != uint32(i) || !m.Alive || m.Draining || m.Addr == "" {
			t.Errorf("member %d: %+v", i, m)
		}
	}
	if s.Sealed.MasterAddr == "" || s.Sealed.MasterPort == 0 {
		t.Errorf("master %q:%d", s.Sealed.MasterAddr, s.Sealed.MasterPort)
	}
}

func TestAdminDrainMemberSurvivorsReformWithoutIt(t *testing.T) {
	// A lease far longer than the test's patience and a last call longer than the join
	// timeout: round 1 forms in time only because the drain is seen at once and nobody waits
	// for the drained node.
	url := testEtcd.url("drain", "min_nodes=2&max_nodes=3&last_call_timeout=60&join_timeout=20&lease_ttl=60")
	nodes := formRound(t, url, 3)
	ids := nodeIDs(nodes)
	for _, n := range []*Rendezvous{nodes[0], nodes[2]} {
		if lost, err := n.NumLost(ctx); err != nil || lost != 0 {
			t.Fatalf("NumLost before the drain: %d, %v", lost, err)
		}
	}
	a := mustAdmin(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statuses, errs := a.Watch(ctx)
	seen := watchUntil(t, statuses, errs, 10*time.Second, "round 0 of 3", func(s *RunStatus) bool {
		return s.Sealed != nil && len(s.Members()) == 3
	})

	if err := a.Drain(ctxTimeout(t, 30*time.Second), ids[1], "maintenance"); err != nil {
		t.Fatalf("Drain(%s): %v", ids[1], err)
	}
	seen = append(seen, watchUntil(t, statuses, errs, 10*time.Second, "node 1 draining", func(s *RunStatus) bool {
		m := s.Members()
		return len(m) == 3 && m[1].Draining && m[1].Alive && !m[0].Draining && !m[2].Draining
	})...)
	if last := seen[len(seen)-1]; last.NumDraining != 1 || last.NumLost != 0 {
		t.Errorf("drained member counted as draining %d, lost %d; want 1, 0", last.NumDraining, last.NumLost)
	}

	// The survivors count it lost at once (their agents would re-rendezvous now), answered
	// from their watch: polled as an agent polls, bounded.
	for _, n := range []*Rendezvous{nodes[0], nodes[2]} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			lost, err := n.NumLost(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if lost == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s: NumLost %d 10 s after the drain, want 1", n.NodeID(), lost)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if d, err := nodes[1].IsDraining(ctx); err != nil || !d {
		t.Errorf("drained node IsDraining = %v, %v", d, err)
	}
	if d, err := nodes[0].IsDraining(ctx); err != nil || d {
		t.Errorf("survivor IsDraining = %v, %v", d, err)
	}
	if _, _, err := nodes[1].Next(ctxTimeout(t, 30*time.Second)); !errors.Is(err, ErrGracefulExit) ||
		!strings.Contains(err.Error(), "maintenance") {
		t.Fatalf("drained node's Next: %v, want ErrGracefulExit with the reason", err)
	}

	type outcome struct {
		info RoundInfo
		err  error
	}
	ch := make(chan outcome, 2)
	for _, n := range []*Rendezvous{nodes[0], nodes[2]} {
		go func() {
			info, store, err := n.Next(ctxTimeout(t, 60*time.Second))
			if err == nil {
				store.Close()
			}
			ch <- outcome{info, err}
		}()
	}
	var ranks []int
	for i := 0; i < 2; i++ {
		select {
		case o := <-ch:
			if o.err != nil {
				t.Fatalf("survivor's Next: %v (join_timeout 20 s: a round that waited for the drained node would not form)", o.err)
			}
			if o.info.Round != 1 || o.info.WorldSize != 2 {
				t.Errorf("survivor's round %+v, want round 1 of 2", o.info)
			}
			ranks = append(ranks, int(o.info.Rank))
		case <-time.After(60 * time.Second):
			t.Fatal("survivors did not form round 1")
		}
	}
	sort.Ints(ranks)
	if fmt.Sprint(ranks) != "[0 1]" {
		t.Errorf("survivors' ranks %v", ranks)
	}
	seen = append(seen, watchUntil(t, statuses, errs, 10*time.Second, "round 1 without the drained node", func(s *RunStatus) bool {
		return s.Sealed != nil && s.Sealed.Round == 1
	})...)
	if got, want := memberIDs(seen[len(seen)-1]), []string{ids[0], ids[2]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("round 1 members %v, want %v (rank 0 stays rank 0)", got, want)
	}
	// Every change once, in order.
	for i := 1; i < len(seen); i++ {
		if seen[i].Revision <= seen[i-1].Revision || sameRun(seen[i], seen[i-1]) {
			t.Errorf("status %d (revision %d) does not follow status %d (revision %d) with a change",
				i, seen[i].Revision, i-1, seen[i-1].Revision)
		}
	}
}

func TestAdminDrainUnknownNodeNamesIt(t *testing.T) {
	url := runURL("drain-unknown", 1, 30)
	formRound(t, url, 1)
	a := mustAdmin(t, url)
	err := a.Drain(ctxTimeout(t, 30*time.Second), "no-such-node", "")
	var rerr *Error
	if !errors.Is(err, ErrInvalidArgument) || !errors.As(err, &rerr) || !strings.Contains(rerr.Message, "no-such-node") {
		t.Fatalf("Drain(unknown) = %v, want ErrInvalidArgument naming the node", err)
	}
}

func TestNodeDrainsItself(t *testing.T) {
	url := testEtcd.url("self-drain", "min_nodes=1&max_nodes=2&last_call_timeout=1&join_timeout=30")
	nodes := formRound(t, url, 1)
	if err := nodes[0].Drain(ctx, "preempted"); err != nil {
		t.Fatal(err)
	}
	if d, err := nodes[0].IsDraining(ctx); err != nil || !d {
		t.Fatalf("IsDraining after Drain = %v, %v", d, err)
	}
	if _, _, err := nodes[0].Next(ctxTimeout(t, 30*time.Second)); !errors.Is(err, ErrGracefulExit) {
		t.Fatalf("Next after Drain: %v, want ErrGracefulExit", err)
	}
	s, err := mustAdmin(t, url).Status(ctxTimeout(t, 30*time.Second))
	if err != nil || s.NumDraining != 1 || !s.Members()[0].Draining {
		t.Errorf("status after a self-drain: %+v, %v", s, err)
	}
}

func TestAdminWatchEndsOnContextAndStartsAgain(t *testing.T) {
	url := runURL("watch-cancel", 2, 60)
	a := mustAdmin(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statuses, errs := a.Watch(ctx)
	watchUntil(t, statuses, errs, 10*time.Second, "the first status", func(*RunStatus) bool { return true })

	// One Watch per handle: the C watch is the handle's.
	other, otherErrs := a.Watch(context.Background())
	if _, ok := <-other; ok {
		t.Error("a second Watch delivered a status")
	}
	if err := <-otherErrs; !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("second Watch: %v, want ErrInvalidArgument", err)
	}

	// The first Watch is blocked in C now (nothing changes); a cancel ends it promptly, well
	// before anything else could.
	start := time.Now()
	cancel()
	select {
	case s, ok := <-statuses:
		if ok {
			t.Fatalf("status after cancel: %+v", *s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not end within 10 s of its context's cancel")
	}
	if err := <-errs; !errors.Is(err, ErrCancelled) || !errors.Is(err, context.Canceled) {
		t.Errorf("Watch ended with %v, want ErrCancelled and context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Watch took %v to end after cancel", d)
	}

	// A new Watch on the same handle starts from the current status, which now has a node.
	r := mustRendezvous(t, url)
	startNext(t, r, ctxTimeout(t, 60*time.Second))
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	statuses2, errs2 := a.Watch(ctx2)
	seen := watchUntil(t, statuses2, errs2, 10*time.Second, "the waiting node", func(s *RunStatus) bool {
		return len(s.Waiting) == 1
	})
	if len(seen) != 1 || seen[0].Waiting[0].NodeID != r.NodeID() || seen[0].Waiting[0].MemberRank != -1 {
		t.Errorf("second Watch began with %s, want the waiting newcomer %s first", describe(seen), r.NodeID())
	}
}

func TestAdminCloseRunWakesNext(t *testing.T) {
	url := runURL("admin-close", 2, 60)
	r := mustRendezvous(t, url)
	ch := startNext(t, r, ctxTimeout(t, 60*time.Second))
	a := mustAdmin(t, url)
	if err := a.CloseRun(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	// join_timeout is 60 s: ErrClosed well before shows Next was woken by the close.
	if o := receive(t, ch, 20*time.Second); !errors.Is(o.err, ErrClosed) {
		t.Fatalf("Next: %v, want ErrClosed", o.err)
	}
	if s, err := a.Status(ctxTimeout(t, 30*time.Second)); err != nil || !s.Closed {
		t.Errorf("status after CloseRun: %+v, %v", s, err)
	}
}

func TestAdminPurgeRefusedWhileAliveThenDeletes(t *testing.T) {
	url := runURL("purge", 1, 30)
	nodes := formRound(t, url, 1)
	a := mustAdmin(t, url)
	// Closed, the run keeps its closed marker after its last node leaves (a run that ends
	// normally deletes its own keys): that is what the purge below must delete.
	if err := a.CloseRun(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	res, err := a.Purge(ctxTimeout(t, 30*time.Second), false)
	if err != nil || !res.Refused() || res.RefusedAlive != 1 || res.Deleted != 0 {
		t.Fatalf("Purge with a live node: %+v, %v; want refused by 1", res, err)
	}
	if s, err := a.Status(ctxTimeout(t, 30*time.Second)); err != nil || !s.Exists {
		t.Fatalf("a refused purge deleted the run: %+v, %v", s, err)
	}
	if err := nodes[0].Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := a.Status(ctxTimeout(t, 30*time.Second)); err != nil || !s.Exists || !s.Closed || s.NumAlive != 0 {
		t.Fatalf("status of the closed run after its node left: %+v, %v", s, err)
	}
	res, err = a.Purge(ctxTimeout(t, 30*time.Second), false)
	if err != nil || res.Refused() || res.Deleted == 0 {
		t.Fatalf("Purge after the node left: %+v, %v; want keys deleted", res, err)
	}
	if s, err := a.Status(ctxTimeout(t, 30*time.Second)); err != nil || s.Exists {
		t.Errorf("status after purge: %+v, %v; want no run", s, err)
	}

	// force deletes under a live node too.
	mustRendezvous(t, url)
	if res, err := a.Purge(ctxTimeout(t, 30*time.Second), true); err != nil || res.Deleted == 0 {
		t.Errorf("forced Purge under a live node: %+v, %v", res, err)
	}
}

func TestAdminCloseEndsWatchAndIsIdempotent(t *testing.T) {
	p, err := ParamsFromURL(runURL("admin-free", 1, 30))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, err := NewAdmin(p)
	if err != nil {
		t.Fatal(err)
	}
	statuses, errs := a.Watch(context.Background())
	watchUntil(t, statuses, errs, 10*time.Second, "the first status", func(*RunStatus) bool { return true })
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close under a running Watch did not return")
	}
	for range statuses {
		t.Error("status after Close")
	}
	if err := <-errs; !errors.Is(err, ErrShutdown) {
		t.Errorf("Watch after Close ended with %v, want ErrShutdown", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := a.Status(ctxTimeout(t, 5*time.Second)); !errors.Is(err, ErrShutdown) {
		t.Errorf("Status after Close: %v", err)
	}
	if err := a.Drain(ctxTimeout(t, 5*time.Second), "x", ""); !errors.Is(err, ErrShutdown) {
		t.Errorf("Drain after Close: %v", err)
	}
	if _, err := NewAdmin(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewAdmin(nil): %v", err)
	}
}

// An etcd that goes away for good ends a Watch with ErrConnection instead of leaving it
// waiting for a change that cannot come.
func TestAdminWatchEndsWhenEtcdStaysDown(t *testing.T) {
	// A private etcd, killed below.
	srv, err := startEtcd(100 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	url := fmt.Sprintf("etcd://%s/down-%d?connect_timeout=2", srv.endpoint, time.Now().UnixNano())
	a := mustAdmin(t, url)
	a.probeAfter = 2 * time.Second
	statuses, errs := a.Watch(ctxTimeout(t, 60*time.Second))
	watchUntil(t, statuses, errs, 10*time.Second, "the first status", func(*RunStatus) bool { return true })
	if err := srv.kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Quiet for watchProbeAfter (2 s), then a probe that fails within connect_timeout (2 s):
	// 30 s is far beyond that, and far below the test context's 60 s.
	select {
	case s, ok := <-statuses:
		if ok {
			t.Fatalf("status from a dead etcd: %+v", *s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Watch still running 30 s after etcd died")
	}
	if err := <-errs; !errors.Is(err, ErrConnection) {
		t.Errorf("Watch ended with %v, want ErrConnection", err)
	}
	t.Logf("Watch ended %v after etcd died", time.Since(start).Round(time.Millisecond))
}
