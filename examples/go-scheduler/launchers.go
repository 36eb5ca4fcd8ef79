package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The lines of `rdzv run` this scheduler reads (docs/LAUNCHER.md): the node id it announces
// when it joins, each round it forms, its workers' START lines (printed by the worker below,
// with the restart count the launcher gave them) and the reason it leaves on a drain.
var (
	joiningLine = regexp.MustCompile(`joining run .* as node ([0-9a-zA-Z]+) `)
	formedLine  = regexp.MustCompile(`round (\d+) formed: node rank (\d+) of (\d+),`)
	startLine   = regexp.MustCompile(`^START restart=(\d+) `)
)

const drainedLine = "this node was drained"

// workerScript is each node's one worker: it says which restart it is, then holds until
// the launcher stops it (SIGTERM to its process group ends both sh and sleep).
const workerScript = `echo "START restart=$TORCHELASTIC_RESTART_COUNT rank=$RANK world=$WORLD_SIZE"; exec sleep 600`

// Formed is one round a launcher formed, as it said it.
type Formed struct {
	Round      uint64
	Rank, Of   int
	At         time.Time
	SinceStart time.Duration
	// WorkerStarted: its worker printed its START line in this round.
	WorkerStarted bool
}

// Node is one `rdzv run` process and what it said.
type Node struct {
	Name string // a, b, c... in the order the scheduler started them

	cmd     *exec.Cmd
	idKnown chan struct{} // closed once NodeID is set
	exited  chan struct{} // closed once the process was reaped

	mu          sync.Mutex
	nodeID      string
	formed      []Formed
	restarts    []int // the restart count of every START line of its workers
	saidDrained bool
	lines       []string
	changed     chan struct{} // closed and replaced whenever a line arrives
	exitState   *os.ProcessState
}

// NodeID is the id the launcher announced ("" before it joined).
func (n *Node) NodeID() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nodeID
}

// Formed lists the rounds it formed so far.
func (n *Node) Formed() []Formed {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Formed(nil), n.formed...)
}

// Restarts lists the restart count of each worker start.
func (n *Node) Restarts() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]int(nil), n.restarts...)
}

// SaidDrained reports whether the launcher said it left because it was drained.
func (n *Node) SaidDrained() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.saidDrained
}

// Output is everything the launcher and its workers printed.
func (n *Node) Output() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return strings.Join(n.lines, "\n")
}

// Exit describes how the process ended: "exit 0", "signal killed", or "running".
func (n *Node) Exit() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.exitState == nil {
		return "running"
	}
	if ws, ok := n.exitState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exit %d", n.exitState.ExitCode())
}

// formedRound waits until the launcher says it formed round `round` (and, if started, until
// its worker started in it), for at most limit.
func (n *Node) formedRound(round uint64, started bool, limit time.Duration) (Formed, error) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	what := fmt.Sprintf("form round %d", round)
	if started {
		what += " and start its worker"
	}
	find := func() (Formed, bool) {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, f := range n.formed {
			if f.Round == round && (f.WorkerStarted || !started) {
				return f, true
			}
		}
		return Formed{}, false
	}
	for {
		n.mu.Lock()
		changed := n.changed
		n.mu.Unlock()
		if f, ok := find(); ok {
			return f, nil
		}
		select {
		case <-changed:
		case <-n.exited:
			// Its last lines are in: look once more, then give up.
			if f, ok := find(); ok {
				return f, nil
			}
			return Formed{}, fmt.Errorf("node %s (%s) exited (%s) before it did %s; it said:\n%s",
				n.Name, n.NodeID(), n.Exit(), what, n.Output())
		case <-deadline.C:
			return Formed{}, fmt.Errorf("node %s (%s) did not %s within %v; it said:\n%s",
				n.Name, n.NodeID(), what, limit, n.Output())
		}
	}
}

// wait waits for the process to end, for at most limit.
func (n *Node) wait(limit time.Duration) error {
	select {
	case <-n.exited:
		return nil
	case <-time.After(limit):
		return fmt.Errorf("node %s (%s) still running %v later; it said:\n%s", n.Name, n.NodeID(), limit, n.Output())
	}
}

// kill SIGKILLs the launcher's process group, as a machine that dies would: the launcher
// gets no chance to leave, so the others learn of it only when its lease expires. Its
// workers die with it (PR_SET_PDEATHSIG), being in process groups of their own.
func (n *Node) kill() error {
	return syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
}

// spawner starts every launcher from one goroutine locked to its OS thread: Linux sends a
// child's Pdeathsig when the thread that forked it exits, and a goroutine may otherwise run
// on a thread the Go runtime later ends. When the spawner stops, its thread exits with the
// goroutine and any launcher still running is killed, as it is when the scheduler dies.
type spawner struct {
	reqs chan spawnReq
	done chan struct{}
}

type spawnReq struct {
	cmd    *exec.Cmd
	result chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		defer close(s.done)
		for r := range s.reqs {
			r.result <- r.cmd.Start()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	r := spawnReq{cmd, make(chan error, 1)}
	s.reqs <- r
	return <-r.result
}

func (s *spawner) stop() {
	close(s.reqs)
	<-s.done
}

// launcherSpec is what every launcher of the job gets.
type launcherSpec struct {
	rdzv     string // the rdzv binary
	endpoint string
	runID    string
	nnodes   string // MIN:MAX
	conf     string // --rdzv-conf
	tmpDir   string // the launchers' TMPDIR (their default log directories)
}

// startNode starts one `rdzv run` for the job and reads its output line by line.
func startNode(sp *spawner, spec launcherSpec, name string, epoch time.Time) (*Node, error) {
	cmd := exec.Command(spec.rdzv, "run",
		"--nnodes", spec.nnodes, "--nproc-per-node", "1",
		"--rdzv-endpoint", spec.endpoint, "--rdzv-id", spec.runID,
		"--rdzv-conf", spec.conf,
		"--monitor-interval", "0.1", "--max-restarts", "3",
		"--no-python", "sh", "-c", workerScript)
	// torchrun settings of the caller's environment must not change the job.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PET_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "TMPDIR="+spec.tmpDir)
	// Its own process group (so that a kill reaches it and nothing else), and SIGKILL if the
	// scheduler dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	// One pipe for both streams: the launcher's own lines (stderr) and its workers' (stdout)
	// arrive in the order they were written.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, w, w
	if err := sp.start(cmd); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("starting %s: %w", spec.rdzv, err)
	}
	w.Close()
	n := &Node{Name: name, cmd: cmd, idKnown: make(chan struct{}), exited: make(chan struct{}), changed: make(chan struct{})}
	go func() {
		defer close(n.exited)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			n.add(sc.Text(), epoch)
		}
		r.Close()
		err := cmd.Wait()
		n.mu.Lock()
		n.exitState = cmd.ProcessState
		if n.exitState == nil {
			n.lines = append(n.lines, "(wait: "+err.Error()+")")
		}
		n.mu.Unlock()
	}()
	return n, nil
}

func (n *Node) add(line string, epoch time.Time) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lines = append(n.lines, line)
	if m := joiningLine.FindStringSubmatch(line); m != nil && n.nodeID == "" {
		n.nodeID = m[1]
		close(n.idKnown)
	}
	if m := formedLine.FindStringSubmatch(line); m != nil {
		round, _ := strconv.ParseUint(m[1], 10, 64)
		rank, _ := strconv.Atoi(m[2])
		of, _ := strconv.Atoi(m[3])
		n.formed = append(n.formed, Formed{Round: round, Rank: rank, Of: of, At: now, SinceStart: now.Sub(epoch)})
	}
	if m := startLine.FindStringSubmatch(line); m != nil {
		restart, _ := strconv.Atoi(m[1])
		n.restarts = append(n.restarts, restart)
		if len(n.formed) > 0 {
			n.formed[len(n.formed)-1].WorkerStarted = true
		}
	}
	if strings.Contains(line, drainedLine) {
		n.saidDrained = true
	}
	close(n.changed)
	n.changed = make(chan struct{})
}

// waitNodeID waits for the launcher to announce its node id.
func (n *Node) waitNodeID(limit time.Duration) (string, error) {
	select {
	case <-n.idKnown:
		return n.NodeID(), nil
	case <-n.exited:
		return "", fmt.Errorf("node %s exited (%s) before joining; it said:\n%s", n.Name, n.Exit(), n.Output())
	case <-time.After(limit):
		return "", fmt.Errorf("node %s did not announce its node id within %v; it said:\n%s", n.Name, limit, n.Output())
	}
}
