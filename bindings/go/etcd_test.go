package rdzv

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The etcd every test of this package talks to, started by TestMain.
var testEtcd *etcdServer

func TestMain(m *testing.M) {
	// Read once, at the first call into rdzv: the log test needs info records, and the tests
	// of waits under faults wait for the store's debug record of a wait that watches.
	os.Setenv("RDZV_LOG", "info,rdzv::store=debug")
	SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil))) // quiet unless a test listens
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	srv, err := startEtcd(100 * time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting etcd:", err)
		return 1
	}
	defer srv.stop()
	testEtcd = srv
	return m.Run()
}

// etcdServer is a real etcd started by the repository's etcd-test-server program (the Rust
// tests' own etcd, as a program: tests/fixtures/etcd-test-server.rs, built by `cargo build`;
// RDZV_ETCD_TEST_SERVER names another copy).
// The program ends etcd and its data when its stdin closes: at stop, or when this process
// ends however it ends.
type etcdServer struct {
	cmd      *exec.Cmd
	in       io.WriteCloser
	lines    chan string // the program's answers, one a line
	timeout  time.Duration
	endpoint string
	version  string
}

// startEtcd starts the program and waits, at most readyTimeout, for its
// "ENDPOINT PID DATADIR VERSION" line.
func startEtcd(readyTimeout time.Duration) (*etcdServer, error) {
	program := os.Getenv("RDZV_ETCD_TEST_SERVER")
	if program == "" {
		program = filepath.Join("..", "..", "target", "debug", "etcd-test-server")
	}
	cmd := exec.Command(program)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w (`cargo build` builds %s)", err, program)
	}
	srv := &etcdServer{cmd: cmd, in: in, lines: make(chan string), timeout: readyTimeout}
	go func() {
		defer close(srv.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			srv.lines <- sc.Text()
		}
	}()
	if err := srv.ready(srv.answer()); err != nil {
		srv.stop()
		return nil, err
	}
	return srv, nil
}

// answer is the program's next line, or "" if it exited or did not answer in time.
func (s *etcdServer) answer() string {
	select {
	case line := <-s.lines:
		return line
	case <-time.After(s.timeout):
		return ""
	}
}

func (s *etcdServer) ask(command string) string {
	if _, err := io.WriteString(s.in, command+"\n"); err != nil {
		return ""
	}
	return s.answer()
}

func (s *etcdServer) ready(line string) error {
	f := strings.Fields(line)
	if len(f) < 4 || f[0] == "error" {
		return fmt.Errorf("etcd-test-server: %q (its stderr is above)", line)
	}
	s.endpoint, s.version = f[0], f[3]
	return nil
}

// kill sends etcd SIGKILL, as a crash would; its data stays for restart.
func (s *etcdServer) kill() error { return okOrError(s.ask("kill")) }

// signal sends sig to etcd: SIGSTOP freezes it, SIGCONT resumes it.
func (s *etcdServer) signal(sig syscall.Signal) error {
	return okOrError(s.ask(fmt.Sprintf("signal %d", sig)))
}

// restart starts etcd again on the same ports and data.
func (s *etcdServer) restart() error { return s.ready(s.ask("restart")) }

func okOrError(line string) error {
	if line != "ok" {
		return fmt.Errorf("etcd-test-server: %q", line)
	}
	return nil
}

// stop closes the program's stdin: it kills etcd, removes its data and exits.
func (s *etcdServer) stop() {
	_ = s.in.Close()
	for range s.lines { // drained so that the reader ends
	}
	_ = s.cmd.Wait()
}

var runSeq atomic.Int64

// url is a rendezvous URL on the test etcd with a run id unique in this process.
func (s *etcdServer) url(run, query string) string {
	u := fmt.Sprintf("etcd://%s/%s-go-%d-%d", s.endpoint, run, os.Getpid(), runSeq.Add(1))
	if query != "" {
		u += "?" + query
	}
	return u
}

// runURL is a run of exactly n nodes (the round completes when the n-th joins).
func runURL(run string, n, joinTimeoutS int) string {
	return testEtcd.url(run, fmt.Sprintf("min_nodes=%d&max_nodes=%d&join_timeout=%d", n, n, joinTimeoutS))
}

func mustRendezvous(t *testing.T, url string) *Rendezvous {
	t.Helper()
	p, err := ParamsFromURL(url)
	if err != nil {
		t.Fatalf("ParamsFromURL(%q): %v", url, err)
	}
	defer p.Close()
	r, err := NewRendezvous(p)
	if err != nil {
		t.Fatalf("NewRendezvous: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
