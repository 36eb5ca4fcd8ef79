package rdzv

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeControl writes the control file as `rdzv run --in-process-restart` does: whole, renamed
// into place.
func writeControl(t *testing.T, path string, control map[string]any) {
	t.Helper()
	text, err := json.Marshal(control)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", text, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// A worker's two rounds with a leave between them, the launcher's side played by the test: the
// only test of this process that touches in-process restart (the library reads
// RDZV_INPROCESS_FILE once).
func TestInProcessRoundsAndALeave(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "inprocess.json")
	os.Setenv("RDZV_INPROCESS_FILE", path)
	env := func(rank, world, port string) map[string]string {
		return map[string]string{
			"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
			"GROUP_RANK": rank, "GROUP_WORLD_SIZE": world, "TORCHELASTIC_RESTART_COUNT": "0",
			"MASTER_ADDR": "host-a", "MASTER_PORT": port,
		}
	}
	writeControl(t, path, map[string]any{"generation": 0, "state": "run", "env": env("0", "1", "29500")})
	if !InProcessEnabled() {
		t.Fatal("RDZV_INPROCESS_FILE is set: enabled")
	}
	first, err := InProcessNext(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if first.Rank != 0 || first.WorldSize != 1 || first.MasterPort != 29500 || first.MasterAddr != "host-a" {
		t.Fatalf("first round: %+v", first)
	}
	if InProcessCheck() {
		t.Fatal("no leave asked yet")
	}
	writeControl(t, path, map[string]any{"generation": 1, "state": "leave"})
	if !InProcessCheck() {
		t.Fatal("the leave is seen")
	}
	// No round yet: the wait ends at its timeout, and the leave is answered.
	if _, err := InProcessNext(50 * time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("expected a timeout, got %v", err)
	}
	left, err := os.ReadFile(path + ".left")
	if err != nil || string(left) != "1" {
		t.Fatalf("the answer: %q, %v", left, err)
	}
	writeControl(t, path, map[string]any{"generation": 2, "state": "run", "env": env("3", "4", "29600")})
	second, err := InProcessNext(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if second.Rank != 3 || second.WorldSize != 4 || second.MasterPort != 29600 {
		t.Fatalf("second round: %+v", second)
	}
	if os.Getenv("RANK") != "3" || os.Getenv("MASTER_PORT") != "29600" {
		t.Fatalf("Go's environment: RANK=%q MASTER_PORT=%q", os.Getenv("RANK"), os.Getenv("MASTER_PORT"))
	}
}
