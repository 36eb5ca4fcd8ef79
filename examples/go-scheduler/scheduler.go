package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	rdzv "github.com/rdzv/rdzv/bindings/go"
)

// Config is one job and its schedule.
type Config struct {
	Endpoint string // etcd HOST:PORT
	RunID    string
	Rdzv     string // the rdzv launcher binary
	Nodes    int    // launchers at the start (at least min_nodes, 2)
	// Repeat is how many times a node is drained and how many times one is killed, each
	// timed (the first of each is part of the scenario; more make the medians).
	Repeat   int
	LeaseTTL int // seconds: how long a killed node stays a member
	LastCall int // seconds: how long a round with min_nodes waits for more
	Out      io.Writer
}

// RoundSeen is a sealed round as the watch showed it.
type RoundSeen struct {
	Round   uint64
	Members []string // node ids, in rank order
	At      time.Time
}

// Measure is the time from an action that removes a node to the round without it.
type Measure struct {
	Kind  string // "drain" or "kill"
	Node  string // its name
	Round uint64 // the round formed without it
	// Sealed: until the watch showed the round sealed. Survivors: until the last survivor's
	// launcher said it formed the round (its workers are starting).
	Sealed, Survivors time.Duration
}

// Report is what the scheduler did and saw.
type Report struct {
	RunID    string
	Nodes    []*Node
	Rounds   []RoundSeen
	Drained  []*Node
	Killed   []*Node
	Measures []Measure
	Purged   rdzv.PurgeResult
	// Statuses is the number of statuses the watch delivered.
	Statuses int
}

// NodeByID finds a launcher by the node id it announced.
func (r *Report) NodeByID(id string) *Node {
	for _, n := range r.Nodes {
		if n.NodeID() == id {
			return n
		}
	}
	return nil
}

type seenStatus struct {
	status *rdzv.RunStatus
	at     time.Time
}

type scheduler struct {
	cfg    Config
	spec   launcherSpec
	admin  *rdzv.Admin
	sp     *spawner
	epoch  time.Time
	report *Report
	outMu  sync.Mutex

	mu         sync.Mutex
	seen       []seenStatus
	changed    chan struct{} // closed and replaced at each status
	watchEnded chan struct{}
	watchErr   error
	action     string
	actionAt   time.Time
}

// Run starts the job, runs the schedule against it and returns what happened. Whatever
// happens, every launcher it started is gone when it returns.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	tmp, err := os.MkdirTemp("", "go-scheduler-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	s := &scheduler{
		cfg: cfg,
		spec: launcherSpec{
			rdzv: cfg.Rdzv, endpoint: cfg.Endpoint, runID: cfg.RunID,
			nnodes: "2:4", conf: fmt.Sprintf("lease_ttl=%d,last_call_timeout=%d", cfg.LeaseTTL, cfg.LastCall),
			tmpDir: tmp,
		},
		sp:         newSpawner(),
		epoch:      time.Now(),
		report:     &Report{RunID: cfg.RunID},
		changed:    make(chan struct{}),
		watchEnded: make(chan struct{}),
	}
	defer func() {
		// Launchers still running (the schedule failed midway) are killed, then reaped.
		for _, n := range s.report.Nodes {
			if n.Exit() == "running" {
				_ = n.kill()
				_ = n.wait(10 * time.Second)
			}
		}
		s.sp.stop()
	}()

	params, err := rdzv.ParamsFromURL(fmt.Sprintf("etcd://%s/%s", cfg.Endpoint, cfg.RunID))
	if err != nil {
		return nil, err
	}
	defer params.Close()
	if s.admin, err = rdzv.NewAdmin(params); err != nil {
		return nil, err
	}
	defer s.admin.Close()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	statuses, errs := s.admin.Watch(watchCtx)
	go s.follow(statuses, errs)

	err = s.schedule(ctx)
	stopWatch()
	<-s.watchEnded
	return s.report, err
}

// follow receives the watch's statuses as they come, stamps and keeps them, and prints what
// changed.
func (s *scheduler) follow(statuses <-chan *rdzv.RunStatus, errs <-chan error) {
	var prev *rdzv.RunStatus
	for st := range statuses {
		at := time.Now()
		s.mu.Lock()
		s.seen = append(s.seen, seenStatus{st, at})
		s.report.Statuses++
		if st.Sealed != nil && (prev == nil || prev.Sealed == nil || prev.Sealed.Round != st.Sealed.Round) {
			var ids []string
			for _, m := range st.Members() {
				ids = append(ids, m.NodeID)
			}
			s.report.Rounds = append(s.report.Rounds, RoundSeen{st.Sealed.Round, ids, at})
		}
		close(s.changed)
		s.changed = make(chan struct{})
		action, since := s.action, at.Sub(s.actionAt)
		s.mu.Unlock()
		for _, e := range s.events(prev, st) {
			s.say("event=%s since_action_ms=%d after=%s", e, since.Milliseconds(), action)
		}
		prev = st
	}
	err := <-errs
	s.mu.Lock()
	s.watchErr = err
	s.mu.Unlock()
	close(s.watchEnded)
}

// events describes what changed from prev to st, one entry per event line.
func (s *scheduler) events(prev, st *rdzv.RunStatus) []string {
	var out []string
	if prev == nil {
		out = append(out, fmt.Sprintf("status exists=%t open_round=%d alive=%d", st.Exists, st.OpenRound, st.NumAlive))
	}
	if st.Sealed != nil && (prev == nil || prev.Sealed == nil || prev.Sealed.Round != st.Sealed.Round) {
		out = append(out, fmt.Sprintf("round round=%d members=%s", st.Sealed.Round, s.names(memberIDs(st))))
	}
	before := map[string]rdzv.Member{}
	if prev != nil {
		for _, m := range prev.Members() {
			before[m.NodeID] = m
		}
	}
	for _, m := range st.Members() {
		was, ok := before[m.NodeID]
		if m.Draining && (!ok || !was.Draining) {
			out = append(out, fmt.Sprintf("draining node=%s round=%d", s.name(m.NodeID), st.Sealed.Round))
		}
		if !m.Alive && (!ok || was.Alive) {
			out = append(out, fmt.Sprintf("lost node=%s round=%d", s.name(m.NodeID), st.Sealed.Round))
		}
	}
	waited := map[string]bool{}
	if prev != nil {
		for _, j := range prev.Waiting {
			waited[j.NodeID] = true
		}
	}
	for _, j := range st.Waiting {
		if !waited[j.NodeID] && j.MemberRank < 0 {
			out = append(out, fmt.Sprintf("waiting node=%s open_round=%d", s.name(j.NodeID), st.OpenRound))
		}
	}
	if st.Closed && (prev == nil || !prev.Closed) {
		out = append(out, fmt.Sprintf("closed alive=%d", st.NumAlive))
	}
	if prev != nil && prev.Exists && !st.Exists {
		out = append(out, "gone")
	}
	return out
}

func memberIDs(st *rdzv.RunStatus) []string {
	var ids []string
	for _, m := range st.Members() {
		ids = append(ids, m.NodeID)
	}
	return ids
}

// name is a node id's launcher name, or the id itself for a node this scheduler did not start.
func (s *scheduler) name(id string) string {
	s.mu.Lock()
	nodes := s.report.Nodes
	s.mu.Unlock()
	for _, n := range nodes {
		if n.NodeID() == id {
			return n.Name
		}
	}
	return id
}

func (s *scheduler) names(ids []string) string {
	var out []string
	for _, id := range ids {
		out = append(out, s.name(id))
	}
	return strings.Join(out, ",")
}

func (s *scheduler) say(format string, args ...any) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	fmt.Fprintf(s.cfg.Out, "t=%.3f ", time.Since(s.epoch).Seconds())
	fmt.Fprintf(s.cfg.Out, format+"\n", args...)
}

// act records an action (what the next events are timed from) and returns the index of the
// first status that can follow it.
func (s *scheduler) act(format string, args ...any) (int, time.Time) {
	what := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.action, s.actionAt = strings.ReplaceAll(what, " ", ":"), time.Now()
	from, at := len(s.seen), s.actionAt
	s.mu.Unlock()
	s.say("action=%s", what)
	return from, at
}

// waitStatus waits for a status at index from or later that satisfies want.
func (s *scheduler) waitStatus(ctx context.Context, from int, limit time.Duration, what string,
	want func(*rdzv.RunStatus) bool) (*rdzv.RunStatus, time.Time, error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		s.mu.Lock()
		for ; from < len(s.seen); from++ {
			if want(s.seen[from].status) {
				found := s.seen[from]
				s.mu.Unlock()
				return found.status, found.at, nil
			}
		}
		changed, last := s.changed, s.lastStatus()
		s.mu.Unlock()
		select {
		case <-changed:
		case <-s.watchEnded:
			return nil, time.Time{}, fmt.Errorf("the watch ended while waiting for %s: %v", what, s.watchErr)
		case <-timer.C:
			return nil, time.Time{}, fmt.Errorf("no status with %s within %v; the last: %s", what, limit, describe(last))
		case <-ctx.Done():
			return nil, time.Time{}, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

func (s *scheduler) lastStatus() *rdzv.RunStatus {
	if len(s.seen) == 0 {
		return nil
	}
	return s.seen[len(s.seen)-1].status
}

func describe(st *rdzv.RunStatus) string {
	if st == nil {
		return "none yet"
	}
	text := fmt.Sprintf("%+v", *st)
	if st.Sealed != nil {
		text += fmt.Sprintf(" sealed=%+v", *st.Sealed)
	}
	return text
}

// The bounds of the waits below: far beyond what each step takes on a loaded machine, so a
// step that does not happen fails with what was seen instead of hanging.
const (
	stepLimit = 30 * time.Second
)

func (s *scheduler) schedule(ctx context.Context) error {
	// The job: cfg.Nodes launchers; the first round has them all.
	var members []*Node
	from, _ := s.act("start nodes=%d", s.cfg.Nodes)
	for i := 0; i < s.cfg.Nodes; i++ {
		n, err := s.startNode()
		if err != nil {
			return err
		}
		members = append(members, n)
	}
	if _, err := s.roundOf(ctx, from, 0, members); err != nil {
		return err
	}

	for i := 0; i < s.cfg.Repeat; i++ {
		// More capacity: a node joins, the members see it waiting and re-form with it.
		added, err := s.add(ctx, &members)
		if err != nil {
			return err
		}
		// Planned scale-down: the first time a node that was there from the start, then the
		// one just added.
		victim := added
		if i == 0 && len(members) > 2 {
			victim = members[1]
		}
		if err := s.remove(ctx, "drain", victim, &members); err != nil {
			return err
		}
		if added, err = s.add(ctx, &members); err != nil {
			return err
		}
		// Unplanned loss: the same kind of node, SIGKILLed.
		victim = added
		if i == 0 && len(members) > 2 {
			victim = members[1]
		}
		if err := s.remove(ctx, "kill", victim, &members); err != nil {
			return err
		}
	}

	// The end: close the run (every launcher stops its workers and exits 0), then purge it.
	from, _ = s.act("close")
	if err := s.admin.CloseRun(ctx); err != nil {
		return fmt.Errorf("closing the run: %w", err)
	}
	for _, n := range members {
		if err := n.wait(stepLimit); err != nil {
			return fmt.Errorf("after CloseRun: %w", err)
		}
		s.say("exited node=%s how=%q", n.Name, n.Exit())
	}
	if _, _, err := s.waitStatus(ctx, from, stepLimit, "the run closed with no live node", func(st *rdzv.RunStatus) bool {
		return st.Closed && st.NumAlive == 0
	}); err != nil {
		return err
	}
	s.act("purge")
	res, err := s.admin.Purge(ctx, false)
	if err != nil {
		return fmt.Errorf("purging the run: %w", err)
	}
	if res.Refused() {
		return fmt.Errorf("purge refused: %d node(s) of the run still alive after every launcher exited", res.RefusedAlive)
	}
	s.report.Purged = res
	st, err := s.admin.Status(ctx)
	if err != nil {
		return err
	}
	s.say("purged keys=%d exists_after=%t", res.Deleted, st.Exists)
	if st.Exists {
		return fmt.Errorf("the run still exists after the purge: %s", describe(st))
	}
	s.summary()
	return nil
}

// nextName names launchers a, b, c... in the order they start.
func (s *scheduler) nextName() string {
	if i := len(s.report.Nodes); i < 26 {
		return string(rune('a' + i))
	}
	return fmt.Sprintf("n%d", len(s.report.Nodes))
}

func (s *scheduler) startNode() (*Node, error) {
	name := s.nextName()
	n, err := startNode(s.sp, s.spec, name, s.epoch)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.report.Nodes = append(s.report.Nodes, n)
	s.mu.Unlock()
	id, err := n.waitNodeID(stepLimit)
	if err != nil {
		return nil, err
	}
	s.say("started node=%s id=%s pid=%d", name, id, n.cmd.Process.Pid)
	return n, nil
}

// add starts one more launcher and waits for the round that admits it.
func (s *scheduler) add(ctx context.Context, members *[]*Node) (*Node, error) {
	from, _ := s.act("add node=%s", s.nextName())
	n, err := s.startNode()
	if err != nil {
		return nil, err
	}
	after := s.lastRound()
	*members = append(*members, n)
	if _, err := s.roundOf(ctx, from, after+1, *members); err != nil {
		return nil, err
	}
	return n, nil
}

// remove drains or kills victim and waits for the round without it; the time it took is a
// Measure.
func (s *scheduler) remove(ctx context.Context, kind string, victim *Node, members *[]*Node) error {
	var survivors []*Node
	for _, n := range *members {
		if n != victim {
			survivors = append(survivors, n)
		}
	}
	after := s.lastRound()
	from, at := s.act("%s node=%s", kind, victim.Name)
	switch kind {
	case "drain":
		if err := s.admin.Drain(ctx, victim.NodeID(), "scale down"); err != nil {
			return fmt.Errorf("draining %s: %w", victim.Name, err)
		}
	case "kill":
		if err := victim.kill(); err != nil {
			return fmt.Errorf("killing %s: %w", victim.Name, err)
		}
	}
	round, err := s.roundOf(ctx, from, after+1, survivors)
	if err != nil {
		return err
	}
	m := Measure{Kind: kind, Node: victim.Name, Round: round.Round, Sealed: round.At.Sub(at)}
	for _, n := range survivors {
		f, err := n.formedRound(round.Round, false, stepLimit)
		if err != nil {
			return err
		}
		if d := f.At.Sub(at); d > m.Survivors {
			m.Survivors = d
		}
	}
	s.report.Measures = append(s.report.Measures, m)
	s.say("measure kind=%s node=%s round=%d sealed_ms=%d survivors_ms=%d",
		kind, victim.Name, m.Round, m.Sealed.Milliseconds(), m.Survivors.Milliseconds())
	if err := victim.wait(stepLimit); err != nil {
		return err
	}
	s.say("exited node=%s how=%q", victim.Name, victim.Exit())
	if kind == "drain" {
		s.report.Drained = append(s.report.Drained, victim)
	} else {
		s.report.Killed = append(s.report.Killed, victim)
	}
	*members = survivors
	return nil
}

func (s *scheduler) lastRound() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.report.Rounds) == 0 {
		return 0
	}
	return s.report.Rounds[len(s.report.Rounds)-1].Round
}

// roundOf waits for the first round numbered at least `first` that the watch shows sealed
// after status index from, checks that its members are exactly want (in any order: ranks
// are the library's business) and that each of them says it formed it and started its worker.
func (s *scheduler) roundOf(ctx context.Context, from int, first uint64, want []*Node) (RoundSeen, error) {
	st, at, err := s.waitStatus(ctx, from, stepLimit, fmt.Sprintf("a round >= %d sealed", first), func(st *rdzv.RunStatus) bool {
		return st.Sealed != nil && st.Sealed.Round >= first
	})
	if err != nil {
		return RoundSeen{}, err
	}
	got := memberIDs(st)
	var wantIDs []string
	for _, n := range want {
		wantIDs = append(wantIDs, n.NodeID())
	}
	sortedGot, sortedWant := append([]string(nil), got...), append([]string(nil), wantIDs...)
	sort.Strings(sortedGot)
	sort.Strings(sortedWant)
	if strings.Join(sortedGot, ",") != strings.Join(sortedWant, ",") {
		return RoundSeen{}, fmt.Errorf("round %d sealed with %s, expected %s", st.Sealed.Round, s.names(got), s.names(wantIDs))
	}
	// The next action waits for every member's worker to run, as a real job's would.
	for _, n := range want {
		if _, err := n.formedRound(st.Sealed.Round, true, stepLimit); err != nil {
			return RoundSeen{}, err
		}
	}
	return RoundSeen{st.Sealed.Round, got, at}, nil
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := append([]time.Duration(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	if len(sorted)%2 == 1 {
		return sorted[len(sorted)/2]
	}
	return (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
}

func (s *scheduler) summary() {
	for _, kind := range []string{"drain", "kill"} {
		var sealed, survivors []time.Duration
		for _, m := range s.report.Measures {
			if m.Kind == kind {
				sealed = append(sealed, m.Sealed)
				survivors = append(survivors, m.Survivors)
			}
		}
		s.say("summary kind=%s n=%d sealed_median_ms=%d survivors_median_ms=%d lease_ttl_s=%d last_call_s=%d",
			kind, len(sealed), median(sealed).Milliseconds(), median(survivors).Milliseconds(), s.cfg.LeaseTTL, s.cfg.LastCall)
	}
}
