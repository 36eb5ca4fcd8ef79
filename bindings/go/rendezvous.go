package rdzv

/*
#include <stdlib.h>
#include "rdzv.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"unsafe"
)

// RoundInfo is this node's place in a completed round.
type RoundInfo struct {
	Round      uint64 // 0 for a run's first round, then increasing
	Rank       uint32 // in [0, WorldSize)
	WorldSize  uint32
	MasterAddr string // MASTER_ADDR: rank 0's local_addr option, else its host name
	MasterPort uint16 // MASTER_PORT: a TCP port that was free on rank 0 when it joined
}

// Rendezvous is one node's handle on a rendezvous. Safe for concurrent use, except that only
// one Next runs at a time per handle.
type Rendezvous struct {
	// Every C call holds mu for reading; Close takes it for writing to free the handle, so the
	// handle is never freed under a running call.
	mu   sync.RWMutex
	_ptr *C.rdzv_t

	runID, backend, nodeID string // copied at creation: valid even after Close
}

// NewRendezvous connects to etcd and registers this node (at most connect_timeout, default
// 10 s; ErrConnection if etcd does not answer). params stays owned by the caller.
func NewRendezvous(params *Params) (*Rendezvous, error) {
	if params == nil {
		return nil, &Error{Status: StatusInvalidArgument, Message: "params is nil"}
	}
	params.mu.RLock()
	defer params.mu.RUnlock()
	if params._ptr == nil {
		return nil, errClosedHandle("Params")
	}
	var out *C.rdzv_t
	err := call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_new(params._ptr, &out, e) })
	runtime.KeepAlive(params)
	if err != nil {
		return nil, err
	}
	r := &Rendezvous{
		_ptr:    out,
		runID:   C.GoString(C.rdzv_run_id(out)),
		backend: C.GoString(C.rdzv_backend(out)),
		nodeID:  C.GoString(C.rdzv_node_id(out)),
	}
	runtime.SetFinalizer(r, func(r *Rendezvous) { _ = r.Close() })
	return r, nil
}

// with runs f on the live handle under the read lock.
func (r *Rendezvous) with(f func(ptr *C.rdzv_t) error) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r._ptr == nil {
		return errClosedHandle("Rendezvous")
	}
	err := f(r._ptr)
	runtime.KeepAlive(r)
	return err
}

type nextResult struct {
	info  RoundInfo
	store *C.rdzv_store_t
	err   error
}

// Next joins the next round and blocks until this node is a member of a completed round, the
// run closes (ErrClosed, ErrGracefulExit), join_timeout passes (ErrTimeout), the handle is
// shut down (ErrShutdown) or ctx is done. When ctx is done first, Next cancels the join (the
// node withdraws; the handle stays usable) and returns an error matching both ErrCancelled
// and ctx.Err() (context.Canceled or context.DeadlineExceeded). If the round completes at the
// same moment, the round wins: it is returned, since dropping it would break the others'.
func (r *Rendezvous) Next(ctx context.Context) (RoundInfo, *Store, error) {
	if err := ctx.Err(); err != nil {
		return RoundInfo{}, nil, &Error{Status: StatusCancelled, Message: "context done before next", cause: err}
	}
	tok, err := newCancelToken()
	if err != nil {
		return RoundInfo{}, nil, err
	}
	defer tok.free()
	return r.nextWith(ctx, tok)
}

// nextWith is Next with its C cancel token, which a goroutine cancels when ctx is done: the
// token stays cancelled, so a context that ends just as the call starts still ends it.
func (r *Rendezvous) nextWith(ctx context.Context, tok *cancelToken) (RoundInfo, *Store, error) {
	var res nextResult
	_ = tok.run(ctx, nil, func(t *C.rdzv_cancel_token_t) error {
		res = r.next(t)
		return nil
	})
	if e, ok := res.err.(*Error); ok && e.Status == StatusCancelled && ctx.Err() != nil {
		res.err = &Error{Status: StatusCancelled, Message: e.Message, cause: ctx.Err()}
	}
	if res.err != nil {
		return RoundInfo{}, nil, res.err
	}
	return res.info, newStore(res.store), nil
}

func (r *Rendezvous) next(tok *C.rdzv_cancel_token_t) nextResult {
	var res nextResult
	var round C.rdzv_round_t
	res.err = r.with(func(ptr *C.rdzv_t) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t {
			return C.rdzv_next_with_cancel(ptr, tok, &round, &res.store, e)
		})
	})
	if res.err == nil {
		res.info = RoundInfo{
			Round:      uint64(round.round),
			Rank:       uint32(round.rank),
			WorldSize:  uint32(round.world_size),
			MasterAddr: C.GoString(&round.master_addr[0]),
			MasterPort: uint16(round.master_port),
		}
	}
	return res
}

// RunStore returns a new handle on the run's store: a Store with the methods of a round's
// that lives as long as the run instead of two rounds, for what a job keeps across rounds (a
// restart budget: Add is atomic across nodes; why a node left). Keys under "notes/" are the
// run's notes, which rdzv status shows. Its values go with the run: deleted when the last node
// leaves or the run is purged, expired one lease_ttl after no node is left; once the run is
// gone its calls fail with ErrState and write nothing. Needs no round. Close it when done; its
// calls fail with ErrShutdown once this handle is shut down.
func (r *Rendezvous) RunStore(ctx context.Context) (*Store, error) {
	var store *C.rdzv_store_t
	err := r.withContext(ctx, "run store", func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_run_store_with_cancel(ptr, tok, &store, e)
	})
	if err != nil {
		return nil, err
	}
	return newStore(store), nil
}

// IsClosed reports whether any node has closed the run (one etcd read, at most
// connect_timeout). If ctx ends first, the call ends at once with an error matching both
// ErrCancelled and ctx.Err(); so do the other calls below.
func (r *Rendezvous) IsClosed(ctx context.Context) (bool, error) {
	var closed C.bool
	err := r.withContext(ctx, "is closed", func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_is_closed_with_cancel(ptr, tok, &closed, e)
	})
	if err != nil {
		return false, err
	}
	return bool(closed), nil
}

// SetClosed closes the run for every node: blocked Next calls anywhere return ErrClosed (at
// most close_timeout). If ctx ends first, the close may or may not have been applied.
func (r *Rendezvous) SetClosed(ctx context.Context) error {
	return r.withContext(ctx, "close the run", func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_set_closed_with_cancel(ptr, tok, e)
	})
}

// NumWaiting is the number of nodes waiting for a round after this node's last one; non-zero
// means the members should call Next to admit them.
func (r *Rendezvous) NumWaiting(ctx context.Context) (uint32, error) {
	var n C.uint32_t
	err := r.withContext(ctx, "num waiting", func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_num_waiting_with_cancel(ptr, tok, &n, e)
	})
	if err != nil {
		return 0, err
	}
	return uint32(n), nil
}

// NumLost is the number of members of this node's last round whose lease expired or that
// were drained; non-zero means the round is broken and the survivors should call Next.
func (r *Rendezvous) NumLost(ctx context.Context) (uint32, error) {
	var n C.uint32_t
	err := r.withContext(ctx, "num lost", func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_num_lost_with_cancel(ptr, tok, &n, e)
	})
	if err != nil {
		return 0, err
	}
	return uint32(n), nil
}

// Drain marks this node as leaving the run, as Admin.Drain does for any node: for a node
// that learns first that it will go away (a preemption notice). The other members count it
// in NumLost at once and re-form without it; this node's Next ends with ErrGracefulExit.
// reason may be "". If ctx ends first, the mark may or may not have been written.
func (r *Rendezvous) Drain(ctx context.Context, reason string) error {
	cr := C.CString(reason)
	defer C.free(unsafe.Pointer(cr))
	return r.withContext(ctx, "drain", func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_drain_with_cancel(ptr, cr, tok, e)
	})
}

// IsDraining reports whether this node was drained (by Drain, an operator or a scheduler):
// it should stop its work and leave. One etcd read, at most connect_timeout.
func (r *Rendezvous) IsDraining(ctx context.Context) (bool, error) {
	var draining C.bool
	err := r.withContext(ctx, "is draining", func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_is_draining_with_cancel(ptr, tok, &draining, e)
	})
	if err != nil {
		return false, err
	}
	return bool(draining), nil
}

// withContext makes the C call f on the live handle, with a cancel token that ctx ends (see
// the package's withContext).
func (r *Rendezvous) withContext(ctx context.Context, what string, f func(ptr *C.rdzv_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t) error {
	return withContext(ctx, nil, what, func(tok *C.rdzv_cancel_token_t) error {
		return r.with(func(ptr *C.rdzv_t) error {
			return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return f(ptr, tok, e) })
		})
	})
}

// Cancel ends the Next running on this handle in another goroutine (it returns
// ErrCancelled) or, if none is, the next one to start: a Cancel made just as another
// goroutine calls Next is never lost (the library keeps it, rdzv_cancel). It is used up once
// a Next has returned ErrCancelled because of it, and the handle stays usable. A Next's own
// context is the other way to end it.
func (r *Rendezvous) Cancel() error {
	return r.with(func(ptr *C.rdzv_t) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_cancel(ptr, e) })
	})
}

// Shutdown releases this node: wakes a blocked Next (ErrShutdown) and revokes the node's
// lease. It does not close the run for the others. Idempotent; later calls fail with
// ErrShutdown.
func (r *Rendezvous) Shutdown() error {
	return r.with(func(ptr *C.rdzv_t) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_shutdown(ptr, e) })
	})
}

// Close shuts the node down (waking a blocked Next and store waits), waits for calls in
// flight and frees the handle. Idempotent. Stores obtained from Next must still be closed;
// their calls fail with ErrShutdown from now on.
func (r *Rendezvous) Close() error {
	var err error
	r.mu.RLock()
	if r._ptr != nil {
		err = call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_shutdown(r._ptr, e) })
	}
	r.mu.RUnlock()
	if err != nil && (err.(*Error)).Status == StatusShutdown {
		err = nil // already shut down
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r._ptr == nil {
		return nil
	}
	C.rdzv_free(r._ptr)
	r._ptr = nil
	runtime.SetFinalizer(r, nil)
	return err
}

// RunID is the run id.
func (r *Rendezvous) RunID() string { return r.runID }

// Backend is the backend name ("etcd-v3").
func (r *Rendezvous) Backend() string { return r.backend }

// NodeID is this node's id: hex digits, unique per handle.
func (r *Rendezvous) NodeID() string { return r.nodeID }
