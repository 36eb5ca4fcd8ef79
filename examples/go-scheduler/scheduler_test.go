package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The scheduler against a real etcd (started here) and real `rdzv run` launchers (the binary
// named by RDZV_BIN, else the repository's debug build), with real signals. What the
// scheduler saw through its watch is checked against what the launchers said.

var etcdEndpoint string

func TestMain(m *testing.M) {
	// etcd gets Pdeathsig, which Linux sends when the thread that forked it exits: start it
	// from this goroutine, locked to its thread until os.Exit.
	runtime.LockOSThread()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	stop, endpoint, err := startEtcd(30 * time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting etcd:", err)
		return 1
	}
	defer stop()
	etcdEndpoint = endpoint
	return m.Run()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts the first etcd on PATH on free loopback ports with a temporary data
// directory and waits for it to log that it is ready.
func startEtcd(readyTimeout time.Duration) (stop func(), endpoint string, err error) {
	client, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peer, err := freePort()
	for err == nil && peer == client {
		peer, err = freePort()
	}
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "go-scheduler-etcd-")
	if err != nil {
		return nil, "", err
	}
	clientURL, peerURL := fmt.Sprintf("http://127.0.0.1:%d", client), fmt.Sprintf("http://127.0.0.1:%d", peer)
	cmd := exec.Command("etcd", "--name", "sched", "--data-dir", dir,
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "sched="+peerURL)
	r, w, err := os.Pipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("is etcd on PATH? %w", err)
	}
	w.Close()
	ready, drained := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var tail []string
	go func() {
		// Read etcd's output for its whole life, so that it never blocks on a full pipe.
		defer close(drained)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		signalled := false
		for sc.Scan() {
			if !signalled {
				mu.Lock()
				tail = append(tail, sc.Text())
				mu.Unlock()
				if strings.Contains(sc.Text(), "ready to serve client requests") {
					signalled = true
					close(ready)
				}
			}
		}
		r.Close()
	}()
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-drained
		os.RemoveAll(dir)
	}
	select {
	case <-ready:
		return stop, fmt.Sprintf("127.0.0.1:%d", client), nil
	case <-drained:
	case <-time.After(readyTimeout):
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	return nil, "", fmt.Errorf("etcd did not become ready; it said:\n%s", strings.Join(tail, "\n"))
}

// rdzvBinary is the launcher to run: RDZV_BIN, else the repository's debug build.
func rdzvBinary(t *testing.T) string {
	if bin := os.Getenv("RDZV_BIN"); bin != "" {
		return bin
	}
	bin, err := filepath.Abs("../../target/debug/rdzv")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no rdzv launcher at %s (run cargo build at the repository root, or set RDZV_BIN): %v", bin, err)
	}
	return bin
}

// etcdCount counts the keys under prefix through etcd's own JSON gateway, not through rdzv.
func etcdCount(t *testing.T, prefix string) int {
	t.Helper()
	end := []byte(prefix)
	end[len(end)-1]++ // the prefix's range end: its last byte + 1 (ASCII '/' + 1)
	var out struct {
		Count string `json:"count"` // int64 as a JSON string; absent when 0
	}
	etcdPost(t, "/v3/kv/range", map[string]any{
		"key":        base64.StdEncoding.EncodeToString([]byte(prefix)),
		"range_end":  base64.StdEncoding.EncodeToString(end),
		"count_only": true,
	}, &out)
	if out.Count == "" {
		return 0
	}
	n, err := strconv.Atoi(out.Count)
	if err != nil {
		t.Fatalf("etcd range count %q: %v", out.Count, err)
	}
	return n
}

func etcdPost(t *testing.T, path string, body any, out any) {
	t.Helper()
	data, _ := json.Marshal(body)
	resp, err := http.Post("http://"+etcdEndpoint+path, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatalf("etcd %s: %v", path, err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("etcd %s: %s: %s", path, resp.Status, text)
	}
	if err := json.Unmarshal(text, out); err != nil {
		t.Fatalf("etcd %s answered %s: %v", path, text, err)
	}
}

func TestSchedulerDrainsKillsClosesAndPurges(t *testing.T) {
	// The key count below must be able to see keys: one written here is counted.
	etcdPost(t, "/v3/kv/put", map[string]any{
		"key": base64.StdEncoding.EncodeToString([]byte("/count-check/x")), "value": "",
	}, &struct{}{})
	if n := etcdCount(t, "/count-check/"); n != 1 {
		t.Fatalf("etcd counted %d keys under /count-check/, want the 1 just written", n)
	}

	var out bytes.Buffer
	cfg := Config{
		Endpoint: etcdEndpoint,
		RunID:    fmt.Sprintf("sched-%d", os.Getpid()),
		Rdzv:     rdzvBinary(t),
		Nodes:    2,
		Repeat:   3,
		LeaseTTL: 3,
		LastCall: 1,
		// The scheduler's lines go to the test's output as they come (with -v), and are kept.
		Out: io.MultiWriter(&out, os.Stdout),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	report, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("the scheduler failed: %v\nit printed:\n%s", err, out.String())
	}
	printed := out.String()

	// Every round the watch showed is the round its members' launchers said they formed,
	// with the same ranks and world size, and no launcher formed a round the watch missed.
	// Rounds: 0 (a, b), then per repetition: one added, one drained, one added, one killed.
	if want := 1 + 4*cfg.Repeat; len(report.Rounds) != want {
		t.Errorf("the watch showed %d rounds, want %d: %+v", len(report.Rounds), want, report.Rounds)
	}
	formedBy := map[uint64]map[string]Formed{} // round -> node id -> what it said
	for _, n := range report.Nodes {
		for _, f := range n.Formed() {
			if formedBy[f.Round] == nil {
				formedBy[f.Round] = map[string]Formed{}
			}
			formedBy[f.Round][n.NodeID()] = f
		}
	}
	seenRounds := map[uint64]bool{}
	for _, r := range report.Rounds {
		seenRounds[r.Round] = true
		said := formedBy[r.Round]
		if len(said) != len(r.Members) {
			t.Errorf("round %d: the watch showed members %v, %d launcher(s) said they formed it", r.Round, r.Members, len(said))
		}
		for rank, id := range r.Members {
			f, ok := said[id]
			if !ok {
				t.Errorf("round %d: member %s (rank %d) never said it formed it", r.Round, id, rank)
				continue
			}
			if f.Rank != rank || f.Of != len(r.Members) {
				t.Errorf("round %d: %s said rank %d of %d, the watch showed rank %d of %d", r.Round, id, f.Rank, f.Of, rank, len(r.Members))
			}
		}
		if !strings.Contains(printed, fmt.Sprintf("event=round round=%d members=", r.Round)) {
			t.Errorf("no event line for round %d", r.Round)
		}
	}
	for round := range formedBy {
		if !seenRounds[round] {
			t.Errorf("launchers formed round %d, which the watch never showed", round)
		}
	}

	// Each removal: the next round has exactly the previous members but the one removed.
	index := map[uint64]int{}
	for i, r := range report.Rounds {
		index[r.Round] = i
	}
	for _, m := range report.Measures {
		i, ok := index[m.Round]
		if !ok || i == 0 {
			t.Errorf("%s of %s: round %d is not one the watch showed after another", m.Kind, m.Node, m.Round)
			continue
		}
		victim := ""
		for _, n := range report.Nodes {
			if n.Name == m.Node {
				victim = n.NodeID()
			}
		}
		var want []string
		for _, id := range report.Rounds[i-1].Members {
			if id != victim {
				want = append(want, id)
			}
		}
		got := append([]string(nil), report.Rounds[i].Members...)
		sort.Strings(want)
		sort.Strings(got)
		if len(want) != len(report.Rounds[i-1].Members)-1 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s of %s (%s): round %d has %v after round %d had %v", m.Kind, m.Node, victim,
				m.Round, report.Rounds[i].Members, report.Rounds[i-1].Round, report.Rounds[i-1].Members)
		}
	}
	if len(report.Drained) != cfg.Repeat || len(report.Killed) != cfg.Repeat {
		t.Errorf("drained %d and killed %d nodes, want %d each", len(report.Drained), len(report.Killed), cfg.Repeat)
	}

	// A drained launcher leaves with 0 saying why; a killed one died of SIGKILL; the others
	// ended with the close, 0. No launcher ever spent a restart: membership changes, planned
	// or not, restart the workers for free.
	drained, killed := map[*Node]bool{}, map[*Node]bool{}
	for _, n := range report.Drained {
		drained[n] = true
	}
	for _, n := range report.Killed {
		killed[n] = true
	}
	for _, n := range report.Nodes {
		switch {
		case drained[n]:
			if n.Exit() != "exit 0" || !n.SaidDrained() {
				t.Errorf("drained node %s: %s, said it was drained: %t; it said:\n%s", n.Name, n.Exit(), n.SaidDrained(), n.Output())
			}
		case killed[n]:
			if n.Exit() != "signal killed" {
				t.Errorf("killed node %s: %s", n.Name, n.Exit())
			}
		default:
			if n.Exit() != "exit 0" {
				t.Errorf("node %s after the close: %s; it said:\n%s", n.Name, n.Exit(), n.Output())
			}
		}
		for _, restart := range n.Restarts() {
			if restart != 0 {
				t.Errorf("node %s started workers with restart count %v: a restart was spent; it said:\n%s", n.Name, n.Restarts(), n.Output())
				break
			}
		}
		if len(n.Restarts()) == 0 {
			t.Errorf("node %s never started a worker; it said:\n%s", n.Name, n.Output())
		}
	}

	// The purge deleted what the closed run left, and etcd has nothing of the run.
	if report.Purged.Deleted == 0 {
		t.Errorf("purge deleted nothing: %+v", report.Purged)
	}
	if n := etcdCount(t, "/rdzv/"+cfg.RunID+"/"); n != 0 {
		t.Errorf("%d key(s) of the run left in etcd after the purge", n)
	}
	for _, want := range []string{"summary kind=drain n=3", "summary kind=kill n=3", "event=draining node=", "event=closed"} {
		if !strings.Contains(printed, want) {
			t.Errorf("the scheduler did not print %q", want)
		}
	}
}
