package rdzv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The page is mapped on a process's first progress call, from RDZV_PROGRESS_FILE as it is
// then, so the monitored cases run in a child: this test binary again, with
// RDZV_GO_TEST_PROGRESS_CHILD naming what it does. init runs before TestMain, so a child
// starts no etcd; the test reads the page it wrote at the offsets core/src/progress/layout.rs
// documents.

const progressChildEnv = "RDZV_GO_TEST_PROGRESS_CHILD"

func init() {
	mode := os.Getenv(progressChildEnv)
	if mode == "" {
		return
	}
	if strings.HasPrefix(mode, "bench-") {
		testing.Init()
		res := testing.Benchmark(progressBenchmarks[strings.TrimPrefix(mode, "bench-")])
		fmt.Printf("%.3f\n", float64(res.T.Nanoseconds())/float64(res.N))
		os.Exit(0)
	}
	if err := progressChild(mode); err != nil {
		fmt.Fprintln(os.Stderr, "progress child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

const (
	pageBytes       = 4096
	magicAt         = 0
	versionPidAt    = 8
	beatsAt         = 16
	lastBeatAt      = 24
	stepAt          = 32
	stackSignalAt   = 56
	openDepthAt     = 72
	openNameAt      = 88
	sectionsAt      = 192
	sectionBytes    = 64
	sectionCountOff = 40
)

// The child's side of TestProgressMonitoredPage.
func progressChild(mode string) error {
	if mode == "unmappable" {
		if IsMonitored() {
			return errors.New("monitored without a page")
		}
		Heartbeat()
		if err := HeartbeatStep(3); err != nil {
			return err
		}
		if err := SectionBegin("step"); err != nil {
			return err
		}
		return SectionEnd("step")
	}
	if mode != "monitored" {
		return fmt.Errorf("unknown mode %q", mode)
	}
	if !IsMonitored() {
		return errors.New("not monitored")
	}
	Heartbeat()
	Heartbeat()
	if err := HeartbeatStep(41); err != nil { // the page holds step + 1
		return err
	}
	if err := HeartbeatStep(-1); !errors.Is(err, ErrInvalidArgument) {
		return fmt.Errorf("HeartbeatStep(-1): %v, want ErrInvalidArgument", err)
	}
	// Heartbeats from many goroutines at once are all counted.
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 250; i++ {
				Heartbeat()
			}
		}()
	}
	wg.Wait()
	end, err := Section("step")
	if err != nil {
		return err
	}
	if err := end(); err != nil {
		return err
	}
	if err := end(); err != nil { // once only
		return fmt.Errorf("second end: %v", err)
	}
	if err := SectionEnd("never-open"); !errors.Is(err, ErrInvalidArgument) {
		return fmt.Errorf("SectionEnd of a section that is not open: %v, want ErrInvalidArgument", err)
	}
	if err := SetStackSignal(38); err != nil {
		return err
	}
	if err := SectionBegin("outer"); err != nil {
		return err
	}
	return SectionBegin("forward") // left open: depth 2, innermost "forward"
}

// runProgressChild runs the test binary as a progress child doing mode, with
// RDZV_PROGRESS_FILE set to page ("": unset), and returns its output.
func runProgressChild(mode, page string) (string, error) {
	cmd := exec.Command(os.Args[0])
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RDZV_PROGRESS_FILE=") && !strings.HasPrefix(kv, progressChildEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, progressChildEnv+"="+mode)
	if page != "" {
		cmd.Env = append(cmd.Env, "RDZV_PROGRESS_FILE="+page)
	}
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		err = fmt.Errorf("%v: %s", err, ee.Stderr)
	}
	return string(out), err
}

// newPage makes a zeroed progress page, as the launcher does.
func newPage(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "progress")
	if err := os.WriteFile(path, make([]byte, pageBytes), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func TestProgressMonitoredPage(t *testing.T) {
	path := newPage(t)
	if _, err := runProgressChild("monitored", path); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	word := func(at int) uint64 { return binary.NativeEndian.Uint64(page[at:]) }
	name := func(at, n int) string { s, _, _ := strings.Cut(string(page[at:at+n]), "\x00"); return s }
	if got := name(magicAt, 8); got != "RDZVPRG1" {
		t.Errorf("magic %q", got)
	}
	if v := word(versionPidAt); v&0xffffffff != 1 || v>>32 == 0 {
		t.Errorf("version and pid word %#x", v)
	}
	for _, c := range []struct {
		what     string
		at       int
		want     uint64
		atLeast1 bool
	}{
		{"beats", beatsAt, 3 + 4*250, false},
		{"last beat", lastBeatAt, 0, true},
		{"step + 1", stepAt, 42, false},
		{"stack signal", stackSignalAt, 38, false},
		{"open depth", openDepthAt, 2, false},
		{"count of the ended section", sectionsAt + sectionCountOff, 1, false},
	} {
		if got := word(c.at); (c.atLeast1 && got == 0) || (!c.atLeast1 && got != c.want) {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
	if got := name(openNameAt, 48); got != "forward" {
		t.Errorf("open section %q, want forward", got)
	}
	if got := name(sectionsAt, 40); got != "step" {
		t.Errorf("ended section %q, want step", got)
	}
	if got := word(sectionsAt + sectionBytes + sectionCountOff); got != 0 {
		t.Errorf("a second section record, count %d", got)
	}
}

func TestProgressPageThatCannotBeMappedIsNotMonitored(t *testing.T) {
	if _, err := runProgressChild("unmappable", filepath.Join(t.TempDir(), "absent")); err != nil {
		t.Fatal(err)
	}
}

func TestProgressOutsideRdzvRun(t *testing.T) {
	if os.Getenv("RDZV_PROGRESS_FILE") != "" {
		t.Skip("RDZV_PROGRESS_FILE is set")
	}
	if IsMonitored() {
		t.Fatal("monitored without RDZV_PROGRESS_FILE")
	}
	Heartbeat()
	for what, err := range map[string]error{
		"HeartbeatStep(7)":          HeartbeatStep(7),
		"SectionBegin":              SectionBegin("step"),
		"SectionEnd":                SectionEnd("step"),
		"SectionEnd, not open":      SectionEnd("never-open"), // only checked under rdzv run
		"SectionBegin, 39 bytes":    SectionBegin(strings.Repeat("x", 39)),
		"SetStackSignal(0)":         SetStackSignal(0),
		"SectionBegin, cached name": SectionBegin("step"),
	} {
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	// Steps and names are checked everywhere.
	for what, err := range map[string]error{
		"HeartbeatStep(-1)":      HeartbeatStep(-1),
		"SectionBegin, empty":    SectionBegin(""),
		"SectionBegin, 40 bytes": SectionBegin(strings.Repeat("x", 40)),
		"SectionEnd, NUL inside": SectionEnd("a\x00b"),
		"SetStackSignal(65)":     SetStackSignal(65),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", what, err)
		}
	}
	if _, err := Section(""); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Section(\"\"): %v, want ErrInvalidArgument", err)
	}
	end, err := Section("forward")
	if err != nil {
		t.Fatal(err)
	}
	if err := end(); err != nil {
		t.Error(err)
	}
}

// The benchmarks measure a call in the mode of this process (monitored when RDZV_PROGRESS_FILE
// names a page) and in the other mode in a child, whose ns/op they report.
var progressBenchmarks = map[string]func(*testing.B){
	"heartbeat": func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			Heartbeat()
		}
	},
	"section": func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := SectionBegin("step"); err != nil {
				b.Fatal(err)
			}
			if err := SectionEnd("step"); err != nil {
				b.Fatal(err)
			}
		}
	},
}

var childResults sync.Map // "heartbeat monitored=true" -> ns/op

func benchmarkProgress(b *testing.B, which string) {
	here := IsMonitored()
	b.Run("monitored="+strconv.FormatBool(here), progressBenchmarks[which])
	other := !here
	b.Run("monitored="+strconv.FormatBool(other), func(b *testing.B) {
		key := fmt.Sprintf("%s monitored=%v", which, other)
		ns, ok := childResults.Load(key)
		if !ok { // once: the framework calls this again with a larger b.N
			page := ""
			if other {
				page = newPage(b)
			}
			out, err := runProgressChild("bench-"+which, page)
			if err != nil {
				b.Fatal(err)
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
			if err != nil {
				b.Fatalf("child said %q", out)
			}
			ns = v
			childResults.Store(key, v)
		}
		b.ReportMetric(ns.(float64), "ns/op")
	})
}

func BenchmarkHeartbeat(b *testing.B) { benchmarkProgress(b, "heartbeat") }

// BenchmarkSection is a SectionBegin and SectionEnd pair.
func BenchmarkSection(b *testing.B) { benchmarkProgress(b, "section") }
