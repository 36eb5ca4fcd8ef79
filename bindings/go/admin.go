package rdzv

/*
#include <stdlib.h>
#include "rdzv.h"
*/
import "C"

import (
	"context"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Admin is an operator's or scheduler's handle on one run (the run id of its Params): it
// reads the run's status, watches it change, closes, purges and drains it, and never joins
// it (it holds no lease, so it is never counted, waited for or sealed into a round). Safe for
// concurrent use, except that only one Watch runs at a time per handle.
type Admin struct {
	// Every C call holds mu for reading; Close takes it for writing to free the handle, so the
	// handle is never freed under a running call.
	mu   sync.RWMutex
	_ptr *C.rdzv_admin_t

	watching atomic.Bool // a Watch is running: the C watch is one per handle

	// Closed by Close: a watch call in flight, or one that starts before Close has the
	// handle, cancels its token.
	closing   chan struct{}
	closeOnce sync.Once

	// probeAfter is how long a Watch stays quiet before it checks that etcd still answers
	// (see watchProbeAfter); per handle so that a test can shorten it.
	probeAfter time.Duration
}

// RunStatus is a run as an operator sees it, read at one etcd revision (a consistent
// snapshot even while rounds form). It is a copy: nothing in it refers to C memory.
type RunStatus struct {
	RunID string
	// Exists is false when etcd holds nothing for the run: never started, finished and
	// cleaned up, or purged. A run that does not exist is not an error: its status is empty.
	Exists bool
	Closed bool // the run was closed (the marker lasts `retention`)
	// OpenRound is the round open for joining.
	OpenRound uint64
	// Sealed is the last sealed round, the one the members are running; nil when no round
	// has been sealed.
	Sealed *SealedRound
	// Waiting are the nodes that joined the open round, in arrival order: newcomers waiting
	// to be admitted, and members already re-joining during a re-rendezvous.
	Waiting     []Joiner
	NumLost     int   // members of the sealed round that are not alive
	NumDraining int   // members of the sealed round that are alive but drained (leaving)
	NumAlive    int   // live nodes of the run: members, waiting nodes and spares alike
	Revision    int64 // the etcd revision it was read at; a Watch delivers increasing ones
}

// SealedRound is a run's last sealed round.
type SealedRound struct {
	Round      uint64
	MasterAddr string // rank 0's bootstrap address (MASTER_ADDR)
	MasterPort uint16 // rank 0's bootstrap port (MASTER_PORT)
	Members    []Member
}

// Member is one member of a sealed round.
type Member struct {
	Rank   uint32
	NodeID string // as Rendezvous.NodeID names it
	Addr   string // the address it registered; "" when it is not alive
	// Alive: its lease is live. A member that is not alive is lost: the survivors re-form
	// without it.
	Alive bool
	// Draining: it was drained (a planned departure): the survivors re-form without it at once.
	Draining bool
}

// Joiner is a node that joined the round open for joining.
type Joiner struct {
	NodeID string
	Addr   string
	// MemberRank is its rank in the sealed round if it was a member (a re-rendezvous is under
	// way), else -1 (a newcomer waiting to be admitted).
	MemberRank int
	Draining   bool // it was drained: it will not be sealed into a round
}

// Members are the sealed round's members in rank order; none when no round is sealed.
func (s *RunStatus) Members() []Member {
	if s.Sealed == nil {
		return nil
	}
	return s.Sealed.Members
}

// PurgeResult is what Purge did: deleted keys, or refused because nodes were alive.
type PurgeResult struct {
	Deleted      int64  // keys deleted; 0 when refused or when there was nothing
	RefusedAlive uint32 // live nodes that made it refuse (at least 1 when refused); 0 when it purged
}

// Refused reports whether the purge deleted nothing because nodes of the run were alive.
func (p PurgeResult) Refused() bool { return p.RefusedAlive > 0 }

// NewAdmin connects to etcd (at most connect_timeout, default 10 s; ErrConnection if etcd
// does not answer) and registers nothing. params stays owned by the caller; only the
// endpoints, run id, key prefix and timeouts matter.
func NewAdmin(params *Params) (*Admin, error) {
	if params == nil {
		return nil, &Error{Status: StatusInvalidArgument, Message: "params is nil"}
	}
	params.mu.RLock()
	defer params.mu.RUnlock()
	if params._ptr == nil {
		return nil, errClosedHandle("Params")
	}
	var out *C.rdzv_admin_t
	err := call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_admin_new(params._ptr, &out, e) })
	runtime.KeepAlive(params)
	if err != nil {
		return nil, err
	}
	a := &Admin{_ptr: out, probeAfter: watchProbeAfter, closing: make(chan struct{})}
	runtime.SetFinalizer(a, func(a *Admin) { _ = a.Close() })
	return a, nil
}

// with runs f on the live handle under the read lock.
func (a *Admin) with(f func(ptr *C.rdzv_admin_t) error) error {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a._ptr == nil {
		return errClosedHandle("Admin")
	}
	err := f(a._ptr)
	runtime.KeepAlive(a)
	return err
}

// withContext makes the C call f on the live handle with a cancel token that ctx ends (see
// the package's withContext): the call returns at once when ctx is done, with an error
// matching both ErrCancelled and ctx.Err(); a write so ended may or may not have been
// applied.
func (a *Admin) withContext(ctx context.Context, what string, f func(ptr *C.rdzv_admin_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t) error {
	return withContext(ctx, nil, what, func(tok *C.rdzv_cancel_token_t) error {
		return a.with(func(ptr *C.rdzv_admin_t) error {
			return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return f(ptr, tok, e) })
		})
	})
}

// Status reads the run's status at one etcd revision (two or three etcd reads, at most
// connect_timeout). A run that does not exist gives a status with Exists false, not an error.
// If ctx ends first, the call ends at once with an error matching ErrCancelled and ctx.Err().
func (a *Admin) Status(ctx context.Context) (*RunStatus, error) {
	var cs *C.rdzv_run_status_t
	err := a.withContext(ctx, "status", func(ptr *C.rdzv_admin_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_admin_status_with_cancel(ptr, tok, &cs, e)
	})
	if err != nil {
		return nil, err
	}
	return takeStatus(cs), nil
}

// takeStatus copies a C status into Go memory and frees it.
func takeStatus(cs *C.rdzv_run_status_t) *RunStatus {
	defer C.rdzv_run_status_free(cs)
	// Fields are read through the pointer, never by copying the struct: an empty array's
	// pointer is Rust's dangling one (e.g. 0x8), which Go must never hold in a pointer-typed
	// variable (the garbage collector rejects such values on the stack), so it is read only
	// when the count says the array is not empty.
	s := &RunStatus{
		RunID:       C.GoString(cs.run_id),
		Exists:      bool(cs.exists),
		Closed:      bool(cs.closed),
		OpenRound:   uint64(cs.open_round),
		NumLost:     int(cs.num_lost),
		NumDraining: int(cs.num_draining),
		NumAlive:    int(cs.num_alive),
		Revision:    int64(cs.revision),
	}
	if cs.has_sealed {
		sealed := &SealedRound{
			Round:      uint64(cs.sealed_round),
			MasterAddr: C.GoString(cs.master_addr),
			MasterPort: uint16(cs.master_port),
			Members:    []Member{},
		}
		if n := int(cs.num_members); n > 0 {
			for _, m := range unsafe.Slice(cs.members, n) {
				sealed.Members = append(sealed.Members, Member{
					Rank:     uint32(m.rank),
					NodeID:   C.GoString(m.node_id),
					Addr:     C.GoString(m.addr),
					Alive:    bool(m.alive),
					Draining: bool(m.draining),
				})
			}
		}
		s.Sealed = sealed
	}
	s.Waiting = []Joiner{}
	if n := int(cs.num_waiting); n > 0 {
		for _, j := range unsafe.Slice(cs.waiting, n) {
			s.Waiting = append(s.Waiting, Joiner{
				NodeID:     C.GoString(j.node_id),
				Addr:       C.GoString(j.addr),
				MemberRank: int(j.member_rank),
				Draining:   bool(j.draining),
			})
		}
	}
	return s
}

// sameRun reports whether two statuses describe the same state (the revision aside: etcd's
// revision moves with every write, to any run).
func sameRun(x, y *RunStatus) bool {
	a, b := *x, *y
	a.Revision, b.Revision = 0, 0
	return reflect.DeepEqual(a, b)
}

// watchSlice bounds each rdzv_admin_watch call, so the Watch checks on etcd now and then
// (see watchProbeAfter). RDZV_ERR_TIMEOUT after a slice only means "nothing yet".
const watchSlice = time.Second

// watchProbeAfter is how long a Watch stays quiet before it checks that etcd still answers.
// A C watch call that is cut short by its timeout starts its reconnection deadline afresh
// on the next call, so with short slices an etcd that stays down would look like a quiet
// run forever; the probe (a status read, bounded by connect_timeout) ends the Watch with
// ErrConnection instead. It is a health check, not how changes are found: those come from
// the etcd watch.
const watchProbeAfter = 10 * time.Second

// Watch delivers the run's status as it changes: first the current status, then each change
// an operator sees (a join, a seal, a loss, a drain, a close; not the workers' store
// traffic), in order, without polling (the library waits on an etcd watch). The status
// channel is unbuffered: a slow reader delays the next status, never loses one. When the
// watch ends, the status channel is closed and exactly one error is sent on the error
// channel, which is then closed:
//   - ctx done: an error matching ErrCancelled and ctx.Err();
//   - etcd unreachable for longer than connect_timeout: ErrConnection;
//   - the Admin was closed: ErrShutdown;
//   - another Watch is running on this Admin: ErrInvalidArgument.
//
// A Watch ended by its context may be followed by another on the same Admin, which starts
// again from the current status. While the run stays quiet, a Watch reads its status once
// every 10 s, only to notice an etcd that stopped answering (see watchProbeAfter).
func (a *Admin) Watch(ctx context.Context) (<-chan *RunStatus, <-chan error) {
	statuses := make(chan *RunStatus)
	errs := make(chan error, 1)
	if !a.watching.CompareAndSwap(false, true) {
		close(statuses)
		errs <- &Error{Status: StatusInvalidArgument, Message: "watch: another Watch is already running on this Admin"}
		close(errs)
		return statuses, errs
	}
	go func() {
		err := a.watch(ctx, statuses)
		// Free for the next Watch before the caller learns that this one ended.
		a.watching.Store(false)
		close(statuses)
		errs <- err
		close(errs)
	}()
	return statuses, errs
}

type watchResult struct {
	status *RunStatus
	err    error
}

func (a *Admin) watch(ctx context.Context, out chan<- *RunStatus) error {
	cancelled := func() error {
		return &Error{Status: StatusCancelled, Message: "watch: context done", cause: ctx.Err()}
	}
	// The C watch belongs to the handle and goes on where an earlier Watch stopped, so each
	// Watch starts from a status of its own and then passes on only what the C watch reports
	// as newer and different: every change once, in order.
	last, err := a.Status(ctx)
	if ctx.Err() != nil {
		return cancelled()
	}
	if err != nil {
		return err
	}
	select {
	case out <- last:
	case <-ctx.Done():
		return cancelled()
	}
	quietSince := time.Now()
	for {
		// Its token is cancelled when ctx is done: the call returns RDZV_ERR_CANCELLED.
		r := a.watchNext(ctx, watchSlice)
		if ctx.Err() != nil {
			return cancelled()
		}
		if r.err != nil {
			e, ok := r.err.(*Error)
			switch {
			case ok && e.Status == StatusTimeout:
				if time.Since(quietSince) >= a.probeAfter {
					if err := a.probe(ctx); err != nil {
						return err
					}
					quietSince = time.Now()
				}
				continue
			case ok && e.Status == StatusCancelled:
				// Close (or someone's rdzv_admin_cancel): go on unless the handle is gone,
				// which the next call reports.
				continue
			default:
				return r.err
			}
		}
		quietSince = time.Now()
		if r.status.Revision <= last.Revision || sameRun(r.status, last) {
			continue
		}
		last = r.status
		select {
		case out <- last:
		case <-ctx.Done():
			return cancelled()
		}
	}
}

// probe checks that etcd answers, during a long quiet Watch.
func (a *Admin) probe(ctx context.Context) error {
	_, err := a.Status(ctx)
	if ctx.Err() != nil {
		return &Error{Status: StatusCancelled, Message: "watch: context done", cause: ctx.Err()}
	}
	return err
}

func (a *Admin) watchNext(ctx context.Context, timeout time.Duration) watchResult {
	var res watchResult
	res.err = a.with(func(ptr *C.rdzv_admin_t) error {
		var cs *C.rdzv_run_status_t
		err := withCancel(ctx, a.closing, func(tok *C.rdzv_cancel_token_t) error {
			return call(func(e **C.rdzv_error_t) C.rdzv_status_t {
				return C.rdzv_admin_watch_with_cancel(ptr, C.int64_t(timeout.Milliseconds()), tok, &cs, e)
			})
		})
		if err == nil {
			res.status = takeStatus(cs)
		}
		return err
	})
	return res
}

// CloseRun closes the run for every node, as Rendezvous.SetClosed does: blocked Next calls
// anywhere return ErrClosed and later ones fail at once (at most close_timeout). Not to be
// confused with Close, which frees this handle. If ctx ends first, the close may or may not
// have been applied.
func (a *Admin) CloseRun(ctx context.Context) error {
	return a.withContext(ctx, "close the run", func(ptr *C.rdzv_admin_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_admin_close_with_cancel(ptr, tok, e)
	})
}

// Purge deletes every key of the run (rounds, stores, round counter, closed marker), so its
// id can be used again at once. While any node of the run is alive it deletes nothing and
// reports how many are (PurgeResult.Refused), unless force, which leaves running nodes
// without their keys (they fail). The check and the delete are one etcd transaction; if ctx
// ends first, it may or may not have been applied.
func (a *Admin) Purge(ctx context.Context, force bool) (PurgeResult, error) {
	var deleted C.int64_t
	var alive C.uint32_t
	err := a.withContext(ctx, "purge", func(ptr *C.rdzv_admin_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_admin_purge_with_cancel(ptr, C.bool(force), tok, &deleted, &alive, e)
	})
	if err != nil {
		return PurgeResult{}, err
	}
	return PurgeResult{Deleted: int64(deleted), RefusedAlive: uint32(alive)}, nil
}

// Drain marks node nodeID (as Rendezvous.NodeID or a status names it) as leaving the run: a
// planned departure (a preemption notice, maintenance, a scale-down). The other members count
// it in NumLost at once, so they re-rendezvous without waiting for its lease to expire and
// the next round forms without it; its own Next ends with ErrGracefulExit. Does not close
// the run. reason (may be "") is shown to the node and in logs. ErrInvalidArgument, naming
// the node, if it is not a live node of the run. If ctx ends first, the mark may or may not
// have been written.
func (a *Admin) Drain(ctx context.Context, nodeID, reason string) error {
	cn, cr := C.CString(nodeID), C.CString(reason)
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cr))
	return a.withContext(ctx, "drain "+nodeID, func(ptr *C.rdzv_admin_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_admin_drain_with_cancel(ptr, cn, cr, tok, e)
	})
}

// Close stops a running Watch (it ends with ErrShutdown), waits for calls in flight and
// frees the handle. Idempotent. It does not close the run (that is CloseRun).
func (a *Admin) Close() error {
	// Close does not wait out a watch slice: its token is cancelled now, and so is that of a
	// slice that starts before Close holds the lock.
	a.closeOnce.Do(func() { close(a.closing) })
	a.mu.Lock()
	defer a.mu.Unlock()
	if a._ptr != nil {
		C.rdzv_admin_free(a._ptr)
		a._ptr = nil
		runtime.SetFinalizer(a, nil)
	}
	return nil
}
