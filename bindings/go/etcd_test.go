package rdzv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
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
	// etcd dies with this process (Pdeathsig), but Linux sends that signal when the OS thread
	// that forked it exits, and a goroutine may run on any thread, one that the runtime later
	// ends: etcd is started from this goroutine, locked to its thread until os.Exit.
	runtime.LockOSThread()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	srv, err := startEtcd(30 * time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting etcd:", err)
		return 1
	}
	defer srv.stop()
	fmt.Fprintf(os.Stderr, "etcd %s ready at %s\n", srv.version, srv.endpoint)
	testEtcd = srv
	return m.Run()
}

// etcdServer is a real etcd (the first `etcd` on PATH: Debian's 3.4 or one built by
// scripts/etcd-build.sh) on free loopback ports with a temporary data directory.
type etcdServer struct {
	cmd      *exec.Cmd
	dataDir  string
	endpoint string
	version  string // as etcd logged it at startup; set before ready
	drained  chan struct{}
}

// etcdVersionLog finds the server version in etcd's startup log: "etcd Version: 3.4.23" (3.4)
// or "etcd-version":"3.7.3" (3.5 and later, JSON).
var etcdVersionLog = regexp.MustCompile(`etcd Version: (\S+)|"etcd-version":"([^"]+)"`)

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts etcd and waits until it logs "ready to serve client requests", or fails
// after readyTimeout with the last lines etcd printed.
func startEtcd(readyTimeout time.Duration) (*etcdServer, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	for err == nil && peerPort == clientPort {
		peerPort, err = freePort()
	}
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "rdzv-go-etcd-")
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("rdzv-go-test-%d", os.Getpid())
	client := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	cmd := exec.Command("etcd",
		"--name", name, "--data-dir", dataDir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", name+"="+peer)
	r, w, err := os.Pipe()
	if err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w // etcd 3.4 logs on stderr
	// SIGKILL when this test process dies, even by SIGKILL, so a killed run leaves no etcd. Go
	// signals the child itself if the parent is already gone when the child sets it (getppid).
	// Only from TestMain's locked thread: see TestMain.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		os.RemoveAll(dataDir)
		return nil, fmt.Errorf("is etcd on PATH? %w", err)
	}
	w.Close()

	srv := &etcdServer{cmd: cmd, dataDir: dataDir, endpoint: fmt.Sprintf("127.0.0.1:%d", clientPort), drained: make(chan struct{})}
	ready := make(chan struct{})
	var mu sync.Mutex
	var tail []string
	go func() {
		// Drain etcd's output for its whole life so it never blocks on a full pipe.
		defer close(srv.drained)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			tail = append(tail, line)
			if len(tail) > 20 {
				tail = tail[1:]
			}
			mu.Unlock()
			if m := etcdVersionLog.FindStringSubmatch(line); m != nil && !signalled && srv.version == "" {
				srv.version = m[1] + m[2]
			}
			if !signalled && strings.Contains(line, "ready to serve client requests") {
				if srv.version == "" {
					srv.version = "(version not logged)"
				}
				signalled = true
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
		return srv, nil
	case <-srv.drained:
	case <-time.After(readyTimeout):
	}
	srv.stop()
	mu.Lock()
	defer mu.Unlock()
	return nil, errors.New("etcd did not become ready; last output:\n" + strings.Join(tail, "\n"))
}

func (s *etcdServer) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	<-s.drained
	_ = os.RemoveAll(s.dataDir)
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
