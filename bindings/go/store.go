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
	"time"
	"unsafe"
)

// DefaultTimeout, passed as a timeout, means the store's default (300 s unless SetTimeout
// changed it). Any negative duration means the same; 0 means "do not wait".
const DefaultTimeout time.Duration = -1

// Store is the store of one round (c10d Store semantics): keys are non-empty strings of at
// most 4096 bytes, values are bytes. Safe for concurrent use. Its calls fail with ErrShutdown
// once the Rendezvous that produced it is shut down or closed, and a wait still missing its
// keys when the run is closed returns ErrClosed. Close cancels waits in flight. A wait ends
// promptly when its context is done, its node shuts down or its timeout passes, whatever
// etcd is doing.
type Store struct {
	mu   sync.RWMutex
	_ptr *C.rdzv_store_t

	// Closed by Close: every wait in flight, and any that starts before Close has the
	// handle, cancels its token.
	closing   chan struct{}
	closeOnce sync.Once
}

func newStore(ptr *C.rdzv_store_t) *Store {
	s := &Store{_ptr: ptr, closing: make(chan struct{})}
	runtime.SetFinalizer(s, func(s *Store) { _ = s.Close() })
	return s
}

// timeoutMs converts to the C convention: negative = store default, fractions round up so a
// positive timeout never becomes "do not wait".
func timeoutMs(d time.Duration) C.int64_t {
	if d < 0 {
		return -1
	}
	ms := d / time.Millisecond
	if d%time.Millisecond != 0 {
		ms++
	}
	return C.int64_t(ms)
}

func (s *Store) with(f func(ptr *C.rdzv_store_t) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s._ptr == nil {
		return errClosedHandle("Store")
	}
	err := f(s._ptr)
	runtime.KeepAlive(s)
	return err
}

// bytesPtr points C at b's contents (Go memory without Go pointers, so cgo allows it).
func bytesPtr(b []byte) *C.uint8_t {
	if len(b) == 0 {
		return nil
	}
	return (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(b)))
}

// takeBytes copies a library buffer into Go memory and frees it.
func takeBytes(p *C.uint8_t, n C.size_t) []byte {
	if p == nil {
		return []byte{}
	}
	out := make([]byte, int(n))
	copy(out, unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n)))
	C.rdzv_bytes_free(p, n)
	return out
}

// cKeys copies keys into C memory (an array of C strings); free releases it.
func cKeys(keys []string) (arr **C.char, free func()) {
	n := len(keys)
	if n == 0 {
		n = 1 // a valid pointer even for no keys
	}
	ptrSize := C.size_t(unsafe.Sizeof((*C.char)(nil)))
	base := (**C.char)(C.calloc(C.size_t(n), ptrSize))
	slots := unsafe.Slice(base, n)
	for i, k := range keys {
		slots[i] = C.CString(k)
	}
	return base, func() {
		for _, p := range slots {
			C.free(unsafe.Pointer(p))
		}
		C.free(unsafe.Pointer(base))
	}
}

// withContext makes the C call f, which does not wait for other nodes, on the live handle
// with a cancel token that ctx ends (see the package's withContext): the call returns at once
// when ctx is done, with an error matching both ErrCancelled and ctx.Err(); a write so ended
// may or may not have been applied.
func (s *Store) withContext(ctx context.Context, what string, f func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t) error {
	return withContext(ctx, nil, what, func(tok *C.rdzv_cancel_token_t) error {
		return s.with(func(ptr *C.rdzv_store_t) error {
			return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return f(ptr, tok, e) })
		})
	})
}

// Set sets key to value. If ctx ends first, the call ends at once with an error matching
// both ErrCancelled and ctx.Err(), and the write may or may not have been applied; so for
// the store's other writes.
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	err := s.withContext(ctx, "store set", func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_store_set_with_cancel(ptr, ck, bytesPtr(value), C.size_t(len(value)), tok, e)
	})
	runtime.KeepAlive(value)
	return err
}

// Get waits up to timeout for key to be set and returns its value (ErrTimeout if it is still
// absent). DefaultTimeout uses the store's default. If ctx is done first, the wait is
// cancelled and the error matches both ErrCancelled and ctx.Err().
func (s *Store) Get(ctx context.Context, key string, timeout time.Duration) ([]byte, error) {
	vals, err := s.MultiGet(ctx, []string{key}, timeout)
	if err != nil {
		return nil, err
	}
	return vals[0], nil
}

// Add atomically adds delta to the decimal integer at key (absent counts as 0) and returns
// the sum. ErrInvalidArgument if the value is not an integer or the sum overflows. If ctx
// ends first, the error matches ErrCancelled and the add may or may not have been applied.
func (s *Store) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var out C.int64_t
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	err := s.withContext(ctx, "store add", func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_store_add_with_cancel(ptr, ck, C.int64_t(delta), tok, &out, e)
	})
	if err != nil {
		return 0, err
	}
	return int64(out), nil
}

// CompareSet sets key to desired if it holds expected (or is absent and expected is empty),
// atomically, and returns the value the key holds afterwards (expected itself when the key is
// absent and expected is not empty). If ctx ends first, the error matches ErrCancelled and
// the swap may or may not have been applied.
func (s *Store) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var p *C.uint8_t
	var n C.size_t
	err := s.withContext(ctx, "store compare-set", func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_store_compare_set_with_cancel(ptr, ck, bytesPtr(expected), C.size_t(len(expected)),
			bytesPtr(desired), C.size_t(len(desired)), tok, &p, &n, e)
	})
	runtime.KeepAlive(expected)
	runtime.KeepAlive(desired)
	if err != nil {
		return nil, err
	}
	return takeBytes(p, n), nil
}

// Wait waits up to timeout until all keys exist (ErrTimeout otherwise), or until ctx is done
// (an error matching ErrCancelled and ctx.Err()).
func (s *Store) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	ck, free := cKeys(keys)
	defer free()
	return s.blocking(ctx, nil, func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t {
			return C.rdzv_store_wait_with_cancel(ptr, ck, C.size_t(len(keys)), timeoutMs(timeout), tok, e)
		})
	})
}

// blocking runs a waiting call on the live handle with a C cancel token (tok, or a new one
// when nil) that is cancelled when ctx is done or the store is closed. The token stays
// cancelled, so a context that ends just as the call starts still ends it.
func (s *Store) blocking(ctx context.Context, tok *cancelToken, f func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t) error) error {
	if err := ctx.Err(); err != nil {
		return &Error{Status: StatusCancelled, Message: "context done before the store call", cause: err}
	}
	if tok == nil {
		made, err := newCancelToken()
		if err != nil {
			return err
		}
		defer made.free()
		tok = made
	}
	err := s.with(func(ptr *C.rdzv_store_t) error {
		return tok.run(ctx, s.closing, func(t *C.rdzv_cancel_token_t) error { return f(ptr, t) })
	})
	return withCause(ctx, err)
}

// Cancel ends the Get, Wait and MultiGet calls running on this store in other goroutines
// (they return ErrCancelled) or, if none is, the next one to start: a Cancel made just as
// another goroutine starts a wait is never lost (the library keeps it, rdzv_store_cancel). It
// is used up once a wait has returned ErrCancelled because of it; the store stays usable. A
// wait's own context is the other way to end it.
func (s *Store) Cancel() error {
	return s.with(func(ptr *C.rdzv_store_t) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_store_cancel(ptr, e) })
	})
}

// Check reports whether all keys exist now. It does not wait for them; if ctx ends before
// etcd answers, the error matches both ErrCancelled and ctx.Err().
func (s *Store) Check(ctx context.Context, keys []string) (bool, error) {
	var ok C.bool
	ck, free := cKeys(keys)
	defer free()
	err := s.withContext(ctx, "store check", func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_store_check_with_cancel(ptr, ck, C.size_t(len(keys)), tok, &ok, e)
	})
	if err != nil {
		return false, err
	}
	return bool(ok), nil
}

// DeleteKey deletes key and reports whether it existed. If ctx ends first, the error matches
// ErrCancelled and the delete may or may not have been applied.
func (s *Store) DeleteKey(ctx context.Context, key string) (bool, error) {
	var deleted C.bool
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	err := s.withContext(ctx, "store delete", func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_store_delete_key_with_cancel(ptr, ck, tok, &deleted, e)
	})
	if err != nil {
		return false, err
	}
	return bool(deleted), nil
}

// NumKeys is the number of keys in this round's store.
func (s *Store) NumKeys(ctx context.Context) (int64, error) {
	var n C.int64_t
	err := s.withContext(ctx, "store num keys", func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_store_num_keys_with_cancel(ptr, tok, &n, e)
	})
	if err != nil {
		return 0, err
	}
	return int64(n), nil
}

// MultiGet waits up to timeout for all keys, then returns their values read at one revision,
// in the order of keys. If ctx is done first, the wait is cancelled (ErrCancelled).
func (s *Store) MultiGet(ctx context.Context, keys []string, timeout time.Duration) ([][]byte, error) {
	return s.multiGet(ctx, nil, keys, timeout)
}

// multiGet is MultiGet with a cancel token of the caller's (nil: a new one).
func (s *Store) multiGet(ctx context.Context, tok *cancelToken, keys []string, timeout time.Duration) ([][]byte, error) {
	ck, free := cKeys(keys)
	defer free()
	var out [][]byte
	err := s.blocking(ctx, tok, func(ptr *C.rdzv_store_t, t *C.rdzv_cancel_token_t) error {
		// Output arrays in Go memory: C writes only C pointers into them.
		vals := make([]*C.uint8_t, len(keys)+1)
		lens := make([]C.size_t, len(keys)+1)
		if err := call(func(e **C.rdzv_error_t) C.rdzv_status_t {
			return C.rdzv_store_multi_get_with_cancel(ptr, ck, C.size_t(len(keys)), timeoutMs(timeout),
				t, &vals[0], &lens[0], e)
		}); err != nil {
			return err
		}
		out = make([][]byte, len(keys))
		for i := range keys {
			out[i] = takeBytes(vals[i], lens[i])
		}
		return nil
	})
	return out, err
}

// MultiSet sets keys[i] to values[i] for all i, all or nothing (beyond 128 keys, each 128
// in turn, as rdzv_store_multi_set says). If ctx ends first, the error matches
// ErrCancelled and the writes may or may not have been applied.
func (s *Store) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return &Error{Status: StatusInvalidArgument, Message: "MultiSet: keys and values differ in length"}
	}
	ck, freeKeys := cKeys(keys)
	defer freeKeys()
	// cgo forbids Go pointers stored in C memory, so the values are copied to C memory too.
	n := len(values) + 1
	cvals := unsafe.Slice((**C.uint8_t)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof((*C.uint8_t)(nil))))), n)
	clens := make([]C.size_t, n)
	defer func() {
		for _, p := range cvals {
			C.free(unsafe.Pointer(p))
		}
		C.free(unsafe.Pointer(&cvals[0]))
	}()
	for i, v := range values {
		if len(v) > 0 {
			cvals[i] = (*C.uint8_t)(C.CBytes(v))
		}
		clens[i] = C.size_t(len(v))
	}
	return s.withContext(ctx, "store multi-set", func(ptr *C.rdzv_store_t, tok *C.rdzv_cancel_token_t, e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_store_multi_set_with_cancel(ptr, ck, &cvals[0], &clens[0], C.size_t(len(keys)), tok, e)
	})
}

// SetTimeout sets the default timeout of Get, Wait and MultiGet (must be >= 0).
func (s *Store) SetTimeout(timeout time.Duration) error {
	return s.with(func(ptr *C.rdzv_store_t) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t {
			return C.rdzv_store_set_timeout(ptr, timeoutMs(timeout), e)
		})
	})
}

// Close cancels waits in flight (they return ErrCancelled), waits for calls in flight to
// return and frees the store handle. Idempotent.
func (s *Store) Close() error {
	// A waiter must not make Close wait out its timeout: its token is cancelled now, and so is
	// that of a wait that starts before Close holds the lock.
	s.closeOnce.Do(func() { close(s.closing) })
	s.mu.Lock()
	defer s.mu.Unlock()
	if s._ptr != nil {
		C.rdzv_store_free(s._ptr)
		s._ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}
