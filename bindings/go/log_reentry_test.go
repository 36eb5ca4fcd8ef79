package rdzv

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// callsRdzv is a slog handler that calls the library from inside: IsClosed on one handle for
// every record, and Close of another at the first "round complete" (as a finalizer could).
type callsRdzv struct {
	observer, victim *Rendezvous
	mu               sync.Mutex
	calls            int
	errs             []string
	closeErr         error
	closed           bool
}

func (h *callsRdzv) Enabled(context.Context, slog.Level) bool { return true }
func (h *callsRdzv) Handle(_ context.Context, rec slog.Record) error {
	closed, err := h.observer.IsClosed(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	if err != nil || closed {
		h.errs = append(h.errs, fmt.Sprint(closed, err))
	}
	if !h.closed && strings.HasPrefix(rec.Message, "round complete") {
		h.closed = true
		h.mu.Unlock()
		err := h.victim.Close()
		h.mu.Lock()
		h.closeErr = err
	}
	return nil
}
func (h *callsRdzv) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *callsRdzv) WithGroup(string) slog.Handler      { return h }

// Records are delivered on the library's runtime threads and inside other calls: a handler's
// blocking call there once failed with a panic caught at the C boundary, and a handle closed
// there was never shut down.
func TestLogHandlerMayCallRdzv(t *testing.T) {
	url := runURL("logreenter", 1, 30)
	h := &callsRdzv{observer: mustRendezvous(t, url), victim: mustRendezvous(t, url)}
	defer h.observer.Close()
	SetLogger(slog.New(h))
	r := mustRendezvous(t, url)
	_, s, err := r.Next(ctxTimeout(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	r.Close()
	SetLogger(nil)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.calls == 0 || len(h.errs) > 0 {
		t.Fatalf("%d calls from the handler, failed: %v", h.calls, h.errs)
	}
	if !h.closed || h.closeErr != nil {
		t.Fatalf("closing a handle from the handler: called %v, error %v", h.closed, h.closeErr)
	}
}
