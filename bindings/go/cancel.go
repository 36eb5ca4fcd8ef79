package rdzv

/*
#include "rdzv.h"
*/
import "C"

import "context"

// cancelToken is a C cancel token (rdzv_cancel_token_t), one per blocking call. It stays
// cancelled, so a context that ends just before the C call starts waiting still ends it:
// nothing needs to repeat the cancel.
type cancelToken struct {
	ptr *C.rdzv_cancel_token_t
}

func newCancelToken() (*cancelToken, error) {
	var out *C.rdzv_cancel_token_t
	if err := call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_cancel_token_new(&out, e) }); err != nil {
		return nil, err
	}
	return &cancelToken{ptr: out}, nil
}

// cancel never blocks and is safe from any goroutine.
func (t *cancelToken) cancel() { C.rdzv_cancel_token_cancel(t.ptr, nil) }

func (t *cancelToken) free() { C.rdzv_cancel_token_free(t.ptr) }

// withCancel runs f, a blocking C call made with a new token, and cancels that token as soon
// as ctx is done or closing is closed (nil: never). It returns once f has returned and
// nothing uses the token any more, which it then frees.
func withCancel(ctx context.Context, closing <-chan struct{}, f func(tok *C.rdzv_cancel_token_t) error) error {
	tok, err := newCancelToken()
	if err != nil {
		return err
	}
	defer tok.free()
	return tok.run(ctx, closing, f)
}

// run is withCancel with a token of the caller's: a test cancels it before the call.
func (t *cancelToken) run(ctx context.Context, closing <-chan struct{}, f func(tok *C.rdzv_cancel_token_t) error) error {
	returned, watcher := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-ctx.Done():
			t.cancel()
		case <-closing:
			t.cancel()
		case <-returned:
		}
	}()
	err := f(t.ptr)
	close(returned)
	<-watcher
	return err
}

// bounded runs f, a C call that takes no cancel token but is bounded by the library (at most
// connect_timeout or close_timeout), and returns its error, or, if ctx ends first, an error
// matching ErrCancelled and ctx.Err(). The call then goes on in a goroutine and may still take
// effect (a write is not undone); closing the handle waits for it. So f must own what it uses:
// C strings it makes and frees itself, and no buffer the caller may reuse. A ctx that can never
// end (context.Background()) runs f on the caller's goroutine.
func bounded(ctx context.Context, what string, f func() error) error {
	if err := ctx.Err(); err != nil {
		return &Error{Status: StatusCancelled, Message: "context done before " + what, cause: err}
	}
	if ctx.Done() == nil {
		return f()
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return &Error{Status: StatusCancelled, cause: ctx.Err(),
			Message: what + ": context done while etcd had not answered; the call finishes in the background and may still take effect"}
	}
}
